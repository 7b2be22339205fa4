"""Cost tables measured where the stages run: each SSH host that has the model is calibrated on itself.

A plan prices each host by its cost table (skippy.plan.costs). For an SSH host that names `ssh.model_path` (the
model's GGUF already there) and no `calibration`, `hosts_calibrated_there` checks the host (skippy.remote.probe:
the same skippy), then runs `host_agent calibrate` there: skippy.plan.calibrate on that machine, cached in its own
cache directory by the model's digest, the llama.cpp build and the machine, so a second plan measures nothing.
The table comes back over SSH into this machine's cost cache (`plan/<host>-<name there>`) and becomes the host's
`calibration`. Hosts are measured one after another (hosts that share a machine, as namespace hosts do, would
slow each other down). An SSH host without the model there keeps this machine's table (scaled by its `speed`): the
whole model sent only to time it would undo sending each host only its layers; `calibration` (measured there with
`python -m skippy.plan.calibrate MODEL --out FILE`) or `model_path` prices it. Failures are one line naming the
host (`HostUnusable`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from skippy.plan.calibrate import cost_cache_path
from skippy.plan.costs import ComputeCosts
from skippy.plan.hosts import Host
from skippy.remote.ssh import RemoteError, run_remote
from skippy.remote.ssh_stages import HostUnusable, check_host, host_label
from skippy.runtime.slices import file_digest

__all__ = ["hosts_calibrated_there"]

CALIBRATE_TIMEOUT_S = 900.0  # a slow host measuring a large model


def _say(line: str) -> None:
    print(f"skippy plan: {line}", file=sys.stderr, flush=True)


def hosts_calibrated_there(model: Path, hosts: Sequence[Host], *, refresh: bool = False,
                           say: Callable[[str], None] = _say) -> list[Host]:
    """`hosts`, each SSH host that has the model (and no `calibration`) with the cost table measured on it."""
    out = []
    for host in hosts:
        target = host.ssh
        if target is None or host.calibration is not None:
            out.append(host)
        elif target.model_path is None:
            say(f"{host.name}: priced with this machine's cost table (no ssh.model_path there to measure with)")
            out.append(host)
        else:
            try:
                out.append(replace(host, calibration=str(_calibrate(model, host, target.model_path, refresh, say))))
            except RemoteError as error:
                raise HostUnusable(host.name, str(error)) from None
    return out


def _calibrate(model: Path, host: Host, model_path: str, refresh: bool, say: Callable[[str], None]) -> Path:
    target = host.ssh
    assert target is not None
    label = host_label(host)
    check_host(host, label, [])
    digest = file_digest(model)
    text = run_remote(target, label, ["-m", "skippy.remote.host_agent", "calibrate", model_path, digest,
                                      target.cache_dir, *(["--refresh"] if refresh else [])],
                      timeout_s=CALIBRATE_TIMEOUT_S)
    try:
        found = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"{label}: its calibration answered {text.strip()[-200:]!r}, not JSON") from None
    if found["sha256"] is None:
        raise RemoteError(f"{label}: its ssh.model_path {model_path} is not there (no such file)")
    if found["costs"] is None:
        raise RemoteError(f"{label}: its ssh.model_path {model_path} is another model (sha256"
                          f" {str(found['sha256'])[:12]}), not {model.name} ({digest[:12]})")
    path = cost_cache_path(model, "all").parent / f"{host.name}-{found['name']}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found["costs"], indent=1))
    costs = ComputeCosts.load(path)
    where = "cached there" if found["cached"] else "measured there"
    say(f"{host.name}: cost table {where} ({costs.stage_ms(0, costs.n_layer, 1):.1f} ms per token for the whole"
        f" model at 1 row)")
    return path
