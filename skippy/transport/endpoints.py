"""Endpoint names: an ipc:// endpoint for a socket file, and stage 0's request endpoint next to its pipeline one."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ipc_endpoint", "request_endpoint"]

_IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def ipc_endpoint(directory: Path, name: str) -> str:
    """``ipc://`` endpoint for socket file ``name`` in ``directory`` (which must exist to bind)."""
    if not name or "/" in name:
        raise ValueError(f"ipc socket name must be a plain file name, got {name!r}")
    path = str(Path(directory).absolute() / name)
    if len(path.encode()) > _IPC_PATH_MAX:
        raise ValueError(f"ipc socket path is {len(path.encode())} bytes, over the {_IPC_PATH_MAX}-byte limit: {path}")
    return f"ipc://{path}"


def request_endpoint(pipeline_endpoint: str) -> str:
    """Where stage 0 takes requests: `ipc://PATH` -> `ipc://PATH.req`, `tcp://H:P` -> `tcp://H:P+1`."""
    if pipeline_endpoint.startswith("ipc://"):
        return pipeline_endpoint + ".req"
    if pipeline_endpoint.startswith("tcp://"):
        host, _, port = pipeline_endpoint[len("tcp://") :].rpartition(":")
        return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"cannot derive a request endpoint from {pipeline_endpoint!r} (use ipc:// or tcp://)")
