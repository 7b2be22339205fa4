"""llama.cpp, as a stage runs it: model loading, slices, contexts, batches, sampling, the tokenizer.

- `stage_runtime.py`: `StageRuntime`, one layer range over llama.cpp; start here. `spec.py`: what it loads;
  `stage_params.py`: its context parameters (KV cells, batch sizes, output rows); `context_size.py`: a
  session's context and the lanes' KV pool, by default from the model and memory; `windows.py`: the value
  types of a decode call; `lane_contexts.py`: `--deterministic`, one context per lane.
- `prefix_cache.py` and `kv_ledger.py`: kept prompt prefixes and the KV cells they hold; `entry_states.py`: the
  entries themselves, copies of a lane's sequence state kept outside the KV pool.
- `llama_backend.py` (process-wide state and log lines), `llama_model.py` (weights), `llama_api.py`
  (contexts, batches), `capture.py` (the compiled eval callback of a non-final stage, from capture.c),
  `resident.py` (dropping the mapped pages of a loaded slice, so a stage's RSS is what it touches).
- `slices.py` and `gguf_file.py`: slice GGUFs of a layer range; `models.py`: where model files come from;
  `part_packages.py`: a GGUF shipped as numbered PyPI part packages, assembled once into the cache.
- `families.py`: the architectures split and each one's rules (docs/families.md is generated from it);
  `layer_kinds.py`: the per-layer kinds (sliding-window, attention, recurrent) a slice must keep.
- `sampling.py` (a session's llama.cpp sampler chain), `session_samplers.py` (every session's, and what one
  samples from a logits row), `grammar_sampler.py` (a session's grammar): the final stage's sampling;
  `mtp.py`: native MTP drafting at the final stage; `tokenizer.py`: vocabulary-only text <-> ids.
- `chain.py`: `LocalChain`, a model's slices run one after another in one process (the unsplit model with no
  split points); `smoke.py`: the build's smoke check; `invariance.py`: the batch-invariance probe.
- `errors.py`: the errors it raises for bad models and bad requests.

Nothing here knows about processes or sockets.
"""
