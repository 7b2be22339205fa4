"""skippy: one GGUF model split by layers across processes, llama.cpp per stage, ZeroMQ between stages.

Its rooms, top to bottom: a module imports its own room and the rooms below it, never above
(tests/structure/test_import_layers.py keeps the order; the admission broker is the top-level package brokers).

- `cli/`: the `skippy` command, one module per subcommand; commands only, nothing imports it.
- `bench/`: the benchmarks behind `skippy bench KIND` (ratios measured side by side in one run).
- `remote/`: stages started on other machines over SSH, each host sent only its layers (`skippy up --hosts`).
- `plan/`: the cost model and the search that picks a split for given hosts (`skippy plan`).
- `testing/`: what tests and benchmarks share: tiny models, reference runs on the unsplit model, a browser.
- `launcher.py`: starting a pipeline's stage processes, each waited for until ready, and stopping them.
- `restarts.py`: `skippy up` restarting a dead child (stage, broker, adapter) with backoff and a give-up limit.
- `adapter/`: the adapter process: OpenAI, llama-server and Anthropic routes over the broker.
- `driver/`: stage 0: admission, the iteration scheduler, micro-batches in flight, speculative decoding.
- `client.py`: `PipelineClient`, the request protocol's client toward stage 0 or a broker.
- `request_events.py`: what a submitted request gives back: its `TokenEvents`, one per step, ending with a final one.
- `stage/`: a stage process after stage 0, and what every stage shares with it (handshake, links, sampling).
- `runtime/`: llama.cpp as a stage runs it: slices, contexts, batches, sampling, the tokenizer.
- `telemetry/`: process-wide telemetry: shared metric types, spans through a bounded queue, /metrics.
- `transport/`: ZeroMQ wrapped once: typed queues of protocol messages, CURVE keys and the guard.
- `http/`: a small HTTP/1.1 server library (h11) that the adapter serves its routes with.
- `cpu_pinning.py`: pinning a process (every thread) to a CPU set, and reading a process's allowed CPUs.
- `netns/`: hosts made of network namespaces on one machine, with link conditions.
- `config/`: typed configuration: stage configs, topologies, plans, serving options and their flags.
- `protocol/`: the wire: every message between processes and its one encoding.
- `supervise.py`: long-lived asyncio tasks whose failure stops their process.
- `faults.py`: failure injection points for tests (`SKIPPY_FAULT`).
- `log.py`: structured JSON log lines and the `ready` / `stopped` lifecycle lines.
- `openmp.py`: OpenMP's spin-wait for llama.cpp's threads, set below before llama_cpp is imported.
"""

import os

from skippy.openmp import set_defaults

# llama.cpp's CPU threads wait at OpenMP barriers: a short spin unless the user chose one (skippy.openmp; the
# launcher gives a stage alone on its cores libgomp's default back). Must happen before llama_cpp is imported.
set_defaults(os.environ)
