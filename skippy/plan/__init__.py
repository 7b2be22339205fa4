"""Planning a split: a cost model measured on the hosts, and the split that serves best within their memory.

- `hosts.py`: the hosts a plan may use (address, CPU set or speed or a cost table, memory budget, link);
- `costs.py`: ms per layer, embedding and head at 1, 4, 16 rows (`ComputeCosts`) and per-batch overheads;
- `calibrate.py`: measuring a `ComputeCosts` with real llama.cpp on a CPU set, cached per model and CPU set;
- `memory.py`: a stage's resident memory from the GGUF's tensor sizes, its KV, llama.cpp's buffers, headroom;
- `predict.py`: the pipeline model, TPOT and tok/s of a split at a concurrency;
- `objective.py`: what a split is chosen for (`--plan-for`): decode rounds, a long prompt's prefill, or both;
- `search.py`: the DP over layer boundaries and hosts that picks the split;
- `plan.py`: `make_plan`, the whole decision (costs per host, every stage count, "don't split"), and its report;
- `write.py`: the chosen split written as a topology `skippy up --topology` serves.
`skippy plan` (skippy.cli.plan) and `skippy up` without `--split` use it. Details: docs/plan.md.
"""
