"""Cost tables measured where the stages run: each SSH host is calibrated on itself.

A plan prices each host by its cost table (skippy.plan.costs). For an SSH host without `calibration`,
`hosts_calibrated_there` checks the host (skippy.remote.probe: the same skippy), then runs `host_agent calibrate`
there: skippy.plan.calibrate on that machine, cached in its own cache directory by the digest of what it timed, the
llama.cpp build and the machine, so a second plan measures nothing. What it times is the model at `ssh.model_path`
when the host names one, else the model's *skeleton* (skippy.runtime.slices: its metadata and tensor shapes, every
tensor zeros, which llama.cpp computes as fast as the model), sent into the host's cache as a slice is: only its
header travels (a few MB; the zeros are holes), not the weights that sending each host only its layers keeps
away. The table comes back over SSH into this machine's cost cache (`plan/<host>-<name there>`) and becomes the
host's `calibration`. Hosts are measured one after another (hosts that share a machine, as namespace hosts do,
would slow each other down). A skeleton's calibration that fails there (killed for memory, say) leaves the host
priced by this machine's table, with a line saying so; an unreachable or unfit host is `HostUnusable` (one line
naming it).
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
from skippy.remote.shipping import send_slice, slice_file
from skippy.remote.ssh import RemoteError, run_remote
from skippy.remote.ssh_stages import HostUnusable, check_host, host_label
from skippy.runtime.slices import ensure_skeleton, file_digest

__all__ = ["hosts_calibrated_there"]

CALIBRATE_TIMEOUT_S = 900.0  # a slow host measuring a large model


def _say(line: str) -> None:
    print(f"skippy plan: {line}", file=sys.stderr, flush=True)


def hosts_calibrated_there(model: Path, hosts: Sequence[Host], *, refresh: bool = False,
                           say: Callable[[str], None] = _say) -> list[Host]:
    """`hosts`, each SSH host without `calibration` with the cost table measured on it."""
    out = []
    for host in hosts:
        target = host.ssh
        if target is None or host.calibration is not None:
            out.append(host)
            continue
        try:
            path = (_calibrate_skeleton(model, host, refresh, say) if target.model_path is None
                    else _calibrate(model, host, target.model_path, refresh, say))
        except RemoteError as error:
            raise HostUnusable(host.name, str(error)) from None
        out.append(host if path is None else replace(host, calibration=str(path)))
    return out


def _calibrate_skeleton(model: Path, host: Host, refresh: bool, say: Callable[[str], None]) -> Path | None:
    target = host.ssh
    assert target is not None
    label = host_label(host)
    piece = slice_file(ensure_skeleton(model))
    found = check_host(host, label, [piece.cache_name])
    cache = str(found["cache_dir"])
    if found["have"].get(piece.cache_name) != piece.size:
        send_slice(target, label, piece, cache)
    try:
        return _measure(model, host, f"{cache}/{piece.cache_name}", piece.sha256, refresh, say,
                        f"on {model.name}'s skeleton, {piece.data_bytes / 1e6:.1f} MB sent")
    except RemoteError as error:
        say(f"{host.name}: priced with this machine's cost table: its calibration there failed ({error})")
        return None


def _calibrate(model: Path, host: Host, model_path: str, refresh: bool, say: Callable[[str], None]) -> Path:
    assert host.ssh is not None
    check_host(host, host_label(host), [])
    return _measure(model, host, model_path, file_digest(model), refresh, say, f"on {model_path} there")


def _measure(model: Path, host: Host, remote_path: str, sha256: str, refresh: bool, say: Callable[[str], None],
             what: str) -> Path:
    """Run the calibration of `remote_path` (whose sha256 must be `sha256`) on the host; the table's path here."""
    target = host.ssh
    assert target is not None
    label = host_label(host)
    text = run_remote(target, label, ["-m", "skippy.remote.host_agent", "calibrate", remote_path, sha256,
                                      target.cache_dir, *(["--refresh"] if refresh else [])],
                      timeout_s=CALIBRATE_TIMEOUT_S)
    try:
        found = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"{label}: its calibration answered {text.strip()[-200:]!r}, not JSON") from None
    if found["sha256"] is None:
        raise RemoteError(f"{label}: its ssh.model_path {remote_path} is not there (no such file)")
    if found["costs"] is None:
        raise RemoteError(f"{label}: its ssh.model_path {remote_path} is another model (sha256"
                          f" {str(found['sha256'])[:12]}), not {model.name} ({file_digest(model)[:12]})")
    path = cost_cache_path(model, "all").parent / f"{host.name}-{found['name']}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found["costs"], indent=1))
    costs = ComputeCosts.load(path)
    where = "cached there" if found["cached"] else "measured there"
    say(f"{host.name}: cost table {where} ({what}; {costs.stage_ms(0, costs.n_layer, 1):.1f} ms per token for the"
        f" whole model at 1 row)")
    return path
