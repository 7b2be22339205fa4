"""skippy.openmp: the short OpenMP spin skippy sets by default, marked as skippy's so the launcher can give a stage
alone on its cores libgomp's default back and a benchmark can start llama-server as its user would; whatever
the user set is kept. Read in a child process, as libgomp reads it (once, when llama.cpp's library loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from skippy.openmp import MARKER, OWN_CORES_SPIN, SHARED_CORES_SPIN, set_defaults, stage_env, user_env

OMP = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", MARKER)


def test_defaults_are_set_and_named_only_where_the_user_set_nothing() -> None:
    environ = {"PATH": "/bin"}
    set_defaults(environ)
    assert environ == {"PATH": "/bin", "GOMP_SPINCOUNT": SHARED_CORES_SPIN, "OMP_WAIT_POLICY": "active",
                       MARKER: "GOMP_SPINCOUNT,OMP_WAIT_POLICY"}
    set_defaults(environ)  # a child skippy process inherits them: still skippy's
    assert environ[MARKER] == "GOMP_SPINCOUNT,OMP_WAIT_POLICY"
    chosen = {"GOMP_SPINCOUNT": "5000"}
    set_defaults(chosen)
    assert chosen == {"GOMP_SPINCOUNT": "5000", "OMP_WAIT_POLICY": "active", MARKER: "OMP_WAIT_POLICY"}


def test_a_stage_alone_on_its_cores_spins_long_unless_the_user_chose() -> None:
    ours: dict[str, str] = {}
    set_defaults(ours)
    assert stage_env(True, ours) == {"GOMP_SPINCOUNT": SHARED_CORES_SPIN}
    assert stage_env(False, ours) == {"GOMP_SPINCOUNT": OWN_CORES_SPIN}
    chosen = {"GOMP_SPINCOUNT": "5000"}
    set_defaults(chosen)
    assert stage_env(False, chosen) == {} and stage_env(True, chosen) == {}


def test_user_env_takes_out_only_what_skippy_set() -> None:
    environ = {"PATH": "/bin", "GOMP_SPINCOUNT": "5000"}
    set_defaults(environ)
    assert user_env(environ) == {"PATH": "/bin", "GOMP_SPINCOUNT": "5000"}


@pytest.mark.parametrize("given", [{}, {"GOMP_SPINCOUNT": "7"}])
def test_importing_skippy_sets_them_before_llama_cpp_loads(given: dict[str, str]) -> None:
    env = {name: value for name, value in os.environ.items() if name not in OMP} | given
    code = ("import json, os, skippy, llama_cpp;"
            f"print(json.dumps({{n: os.environ.get(n) for n in {list(OMP)!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["GOMP_SPINCOUNT"] == given.get("GOMP_SPINCOUNT", SHARED_CORES_SPIN)
    assert seen["OMP_WAIT_POLICY"] == "active"
    assert seen[MARKER] == ("OMP_WAIT_POLICY" if given else "GOMP_SPINCOUNT,OMP_WAIT_POLICY")
