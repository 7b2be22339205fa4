"""The `skippy` command and its subcommands, one module each; the top layer (nothing imports it).

Only commands live here: each module parses its flags, builds its process from the packages below
and runs it. `skippy bench KIND` is registered from skippy.bench, which holds every benchmark.

- `main.py`: the `skippy` command: its subcommands, and expected errors turned into one-line messages.
- `up.py`: `skippy up`, the whole server from one command: stages, broker, adapter, restarts.
- `front.py`: the OpenAI front (broker + adapter as supervised children), for `skippy up` and for stage 0's
  `--openai-bind-addr`.
- `stage.py`: `skippy stage`, one stage process (stage 0 runs the driver).
- `broker.py` and `adapter.py`: the flags of `skippy broker` and `skippy adapter` (their processes are
  brokers.broker_main and skippy.adapter.adapter_main).
- `pipeline.py`: `skippy pipeline` (every stage of a topology, supervised) and `skippy wire` (a running
  pipeline's link conditions).
- `generate.py`: `skippy generate`, a model's slices in one process; `remote_generate.py`: with
  `--topology`, over real stage processes.
- `plan.py`: `skippy plan`, the split for given hosts, its prediction and topology.
- `unused_flags.py`: the `skippy up` / `skippy plan` flags a combination leaves without effect, refused.
- `slice_cmd.py`: `skippy slice`, a slice GGUF for a layer range.
- `keys.py`: `skippy keys`, CURVE key pairs for authenticated links.
- `check_config.py`: `skippy check-config`, a stage's resolved serving options.
- `logs.py`: `skippy logs`, every process's JSON log of a run merged in time order.
- `netns.py`: `scripts/netns-hosts`, namespace hosts made, changed, shown and removed.
"""
