"""What tests and benchmarks share (nothing that serves imports it).

- `tiny_models.py`: tiny random-weight GGUF models for every family (`python -m skippy.testing.tiny_models`),
  with `tiny_families.py`, the table of what one architecture's tiny GGUF holds.
- `reference_runs.py`: reference runs for pipeline tests: a driver's batches replayed on the unsplit model,
  greedy runs with their margins.
- `browser.py`: headless Chromium (Debian's chromium + chromium-driver, through selenium) for looking at pages;
  `dashboard_shot.py`: `scripts/dashboard-screenshot`, a picture of /dashboard under load.
"""
