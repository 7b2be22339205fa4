"""skippy: one GGUF model split by layers across processes, llama.cpp per stage, ZeroMQ between stages."""

import os

# llama.cpp's CPU backend runs on OpenMP, whose idle threads spin ~300k iterations by default: the
# spinning threads of one stage process starve the other stages on the same cores (2 stages on 2
# cores: 2.3 tok/s). Fully passive waiting costs a futex sleep per op barrier (halves decode speed);
# a short spin keeps both (measured: 91 tok/s unsplit, 70 tok/s over 2 stage processes).
# OMP_WAIT_POLICY=active keeps that spin when a process holds more OpenMP threads than cores (a
# second thread that calls llama.cpp brings its own team): libgomp otherwise "throttles" the spin
# to 100 iterations, and batch-8 decode measured 136 tok/s instead of 175 once a second thread had
# run llama.cpp in the process (175 with both settings, either thread).
# Must be set before llama_cpp is imported; an explicit setting by the user wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
os.environ.setdefault("OMP_WAIT_POLICY", "active")
