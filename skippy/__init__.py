"""skippy: one GGUF model split by layers across processes, llama.cpp per stage, ZeroMQ between stages."""

import os

# llama.cpp's CPU backend runs on OpenMP, whose idle threads spin ~300k iterations by default: the
# spinning threads of one stage process starve the other stages on the same cores. Fully passive
# waiting costs a futex sleep per op barrier, which slows decode badly; a short spin keeps both the
# single process and stages sharing cores fast (measured: docs/measurements.md, 'OpenMP spin count').
# OMP_WAIT_POLICY=active keeps that spin when a process holds more OpenMP threads than cores (a
# second thread that calls llama.cpp brings its own team): libgomp otherwise "throttles" the spin
# to 100 iterations, and decode slows down once a second thread has run llama.cpp in the process;
# with the policy active it runs at the same speed whichever thread calls llama.cpp
# (measured: docs/measurements.md, 'OpenMP spin throttle').
# Must be set before llama_cpp is imported; an explicit setting by the user wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
os.environ.setdefault("OMP_WAIT_POLICY", "active")
