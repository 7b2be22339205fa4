"""skippy: one GGUF model split by layers across processes, llama.cpp per stage, ZeroMQ between stages."""

import os

from skippy.openmp import set_defaults

# llama.cpp's CPU threads wait at OpenMP barriers: a short spin unless the user chose one (skippy.openmp; the
# launcher gives a stage alone on its cores libgomp's default back). Must happen before llama_cpp is imported.
set_defaults(os.environ)
