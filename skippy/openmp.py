"""OpenMP's spin-wait for llama.cpp's CPU threads: a short spin by default, libgomp's own for a stage alone.

llama.cpp's CPU backend meets its threads at an OpenMP barrier after every op of a graph; libgomp spins
GOMP_SPINCOUNT iterations there before it sleeps on a futex. libgomp's default (~300k) lets the spinning
threads of stage processes that share cores starve each other (2 stages on 2 cores: 2.3 tok/s), so every
skippy process starts with a short spin (`set_defaults`, from skippy/__init__; docs/measurements.md, 'OpenMP
spin count'). A stage whose CPUs no other stage of its pipeline uses (one stage on a host, stages pinned to
disjoint CPU sets) has nobody to starve, and there the short spin only adds futex sleeps and wake-ups at
the barriers; `stage_env` gives such a stage libgomp's default back, as llama-server runs (one stage of Gemma
3 270M on both cores of a 2-vCPU VM: 2-4% more tok/s at 1 and 8 streams, docs/measurements.md, 'OpenMP spin
of a stage alone'). libgomp reads the variable once, when llama.cpp's
library loads, so the one who starts a process chooses, through its environment. What the user set is kept:
skippy names the variables it set in SKIPPY_OMP_DEFAULTS, and `user_env` takes them out again for a process
that is not skippy's (a benchmark's llama-server runs as its user would run it).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

__all__ = ["OWN_CORES_SPIN", "SHARED_CORES_SPIN", "set_defaults", "stage_env", "user_env"]

SHARED_CORES_SPIN = "1000"  # spin iterations at a barrier: short, for stages that share cores
OWN_CORES_SPIN = "300000"  # libgomp's default, for a stage alone on its cores
SPIN = "GOMP_SPINCOUNT"
WAIT_POLICY = "OMP_WAIT_POLICY"
MARKER = "SKIPPY_OMP_DEFAULTS"  # the variables skippy set (not the user), comma separated


def set_defaults(environ: MutableMapping[str, str]) -> None:
    """A short spin, kept when throttled (OMP_WAIT_POLICY=active: docs/measurements.md, 'OpenMP spin throttle');
    each only where the user set nothing, and named in SKIPPY_OMP_DEFAULTS so child processes can tell."""
    ours = _ours(environ)
    for name, value in ((SPIN, SHARED_CORES_SPIN), (WAIT_POLICY, "active")):
        if name not in environ:
            environ[name] = value
            ours.add(name)
    if ours:
        environ[MARKER] = ",".join(sorted(ours))


def _ours(environ: Mapping[str, str]) -> set[str]:
    return set(filter(None, environ.get(MARKER, "").split(",")))


def stage_env(shares_cores: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The spin for a stage process started with `environ`: short when another stage uses any of its CPUs,
    libgomp's default when none does; nothing when the user chose a spin."""
    if SPIN not in _ours(environ):
        return {}
    return {SPIN: SHARED_CORES_SPIN if shares_cores else OWN_CORES_SPIN}


def user_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without what skippy set (for a process that is not skippy's, as its user would start it)."""
    ours = _ours(environ) | {MARKER}
    return {name: value for name, value in environ.items() if name not in ours}
