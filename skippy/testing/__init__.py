"""What tests and benchmarks share: tiny random-weight GGUF models per family (`tiny_models`, the
family table `tiny_families`), reference
runs that replay a driver's batches on the unsplit model (`replay`), and headless Chromium for pages
(`browser`, `dashboard_shot`)."""
