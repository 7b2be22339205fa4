"""llama.cpp, as a stage runs it: model loading, slices, contexts, batches, sampling, the tokenizer.

- `stage_runtime`: `StageRuntime`, one layer range over llama.cpp (`spec`: what it loads; `windows`:
  the value types of a decode call; `prefix_cache` and `kv_ledger`: kept prompt prefixes).
- `llama_backend` (process-wide state and log lines), `llama_model` (weights), `llama_api` (contexts,
  batches), `capture` (the compiled eval callback of a non-final stage), `resident` (dropping the mapped
  pages of a loaded slice, so a stage's RSS is what it touches).
- `slices` and `gguf_file`: slice GGUFs of a layer range; `models`: where model files come from.
- `families`: the architectures split and each one's rules (docs/families.md is generated from it);
  `layer_kinds`: the per-layer kinds (sliding-window, attention, recurrent) a slice must keep.
- `sampling`, `grammar`: the final stage's sampler chain; `tokenizer`: vocabulary-only text <-> ids.
- `chain`: a model's slices run one after another in one process; `smoke`: the build's smoke check.

Nothing here knows about processes or sockets.
"""
