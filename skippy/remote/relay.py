"""The local end of a stage started over SSH: the command prefix `skippy up` starts that stage through.

`python -m skippy.remote.relay SPEC -- PYTHON -m skippy.cli.main stage --config C --topology T ...` (the launcher
appends the stage's own command line, as it does after `ip netns exec NS`). SPEC, written by
skippy.remote.ssh_stages, names the SSH command that runs `host_agent launch DIR` on the host and the config fields
that differ there (the model: its slice in the host's cache). The relay sends the host agent the stage's files (the
topology, the config, the stage's own secret link key and no other), its arguments and the environment it forwards
(`SKIPPY_*`, such as the API key, and OpenMP's variables: never on a command line), hands the agent's ready line to
the launcher's ready pipe, writes a newline every `KEEPALIVE_S` while the stage runs (the agent stops a stage whose
session falls silent: skippy.remote.host_agent), and leaves SSH's stderr (the stage's JSON log) on its own, which
is the stage's log file in the run directory. SIGTERM or SIGINT ends the session's input, so the host stops the
stage and the relay exits with the stage's status (255: SSH itself failed); if the relay dies, SSH gets SIGTERM,
the connection closes, and the host stops the stage all the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skippy.launcher import die_with_parent
from skippy.log import READY_FD_ENV

NOT_FORWARDED = frozenset({"SKIPPY_CACHE_DIR", READY_FD_ENV, "SKIPPY_MEMORY_LIMIT_BYTES"})
FORWARDED_PREFIXES = ("SKIPPY_", "OMP_", "GOMP_")
KEEPALIVE_S = 5.0


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in environ.items()
            if name.startswith(FORWARDED_PREFIXES) and name not in NOT_FORWARDED}


def header(spec: dict[str, Any], args: list[str], environ: Mapping[str, str]) -> bytes:
    """What the host agent reads first: the stage's files, its arguments (paths there) and environment."""
    args = list(args)
    config_at, topology_at = args.index("--config") + 1, args.index("--topology") + 1
    config = {**json.loads(Path(args[config_at]).read_text()), **spec["config"]}
    topology_path = Path(args[topology_at])
    topology = json.loads(topology_path.read_text())
    for stage in topology["stages"]:  # the topology says how its stage loads, as the config does
        if stage["stage_id"] == config["stage_id"]:
            stage["load_mode"] = config["load_mode"]
    files: dict[str, dict[str, Any]] = {"stage.json": {"text": json.dumps(config, indent=2)}}
    if topology.get("keys_dir") is not None:  # only this stage's secret key goes
        secret = topology_path.parent / topology["keys_dir"] / f"{config['stage_id']}.key_secret"
        files[f"keys/{secret.name}"] = {"text": secret.read_text(), "mode": 0o600}
        topology["keys_dir"] = "keys"
    files["topology.json"] = {"text": json.dumps(topology, indent=2)}
    args[config_at], args[topology_at] = "stage.json", "topology.json"
    env = {**forwarded_env(environ), "SKIPPY_CACHE_DIR": spec["cache_dir"]}
    return json.dumps({"files": files, "args": args, "env": env}).encode() + b"\n"


def relay(spec: dict[str, Any], args: list[str]) -> int:
    ready_fd = os.environ.pop(READY_FD_ENV, None)
    ssh = subprocess.Popen(spec["ssh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent)
    stdin, stdout = ssh.stdin, ssh.stdout
    assert stdin is not None and stdout is not None

    ended = threading.Event()

    def end_session(*_: object) -> None:
        ended.set()
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            stdin.close()  # EOF there: the host agent stops the stage

    def keep_alive() -> None:
        while not ended.wait(KEEPALIVE_S):
            try:
                stdin.write(b"\n")
                stdin.flush()
            except (OSError, ValueError):
                return

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end_session)
    with contextlib.suppress(OSError, ValueError):
        stdin.write(header(spec, args, os.environ))
        stdin.flush()
    threading.Thread(target=keep_alive, daemon=True).start()
    ready = stdout.readline()
    if ready.strip() and ready_fd is not None:
        with contextlib.suppress(OSError), os.fdopen(int(ready_fd), "wb") as pipe:
            pipe.write(ready)
    return ssh.wait()


def main(argv: list[str]) -> int:
    spec_path, rest = argv[0], argv[argv.index("--") + 1:]
    args = rest[rest.index("skippy.cli.main") + 1:]
    return relay(json.loads(Path(spec_path).read_text()), args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
