"""Endpoint strings: ZeroMQ endpoints for stage sockets, host:port for HTTP, http://host:port for OTLP,
a bare host for `--metrics-bind`.

Stage sockets accept ``tcp://host:port``, ``ipc://path``, ``inproc://name``
or a bare ``host:port``, which is normalised to
``tcp://host:port``.  Bind endpoints may use port ``0`` or ``*`` (ephemeral)
and host ``*``; connect endpoints need a concrete host and port.  Errors are
``ValueError`` whose message completes ``field '<name>' ...`` or ``--flag ...``.
"""

from __future__ import annotations

__all__ = ["normalize_host", "normalize_http_addr", "normalize_otlp_url", "normalize_zmq_endpoint", "split_host_port"]

_SCHEMES = ("tcp", "ipc", "inproc")


def split_host_port(text: str, *, bind: bool) -> tuple[str, int | None]:
    """Split ``host:port``; port None means ``*`` (bind only). ValueError if bad."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValueError(f"must be host:port, got '{text}'")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"has a malformed bracketed IPv6 host in '{text}'")
    elif ":" in host:
        raise ValueError(f"needs brackets around an IPv6 host, e.g. '[::1]:5555', got '{text}'")
    if not bind and host == "*":
        raise ValueError(f"needs a concrete host to connect to, got '{text}'")
    if port_text == "*":
        if not bind:
            raise ValueError(f"needs a concrete port to connect to, got '{text}'")
        return host, None
    if not port_text.isdigit() or not (0 if bind else 1) <= int(port_text) <= 65535:
        low = 0 if bind else 1
        raise ValueError(f"must have a port in {low}..65535, got '{text}'")
    return host, int(port_text)


def normalize_zmq_endpoint(value: str, *, bind: bool) -> str:
    """Canonical ZeroMQ endpoint for ``value``; bare host:port becomes tcp://."""
    text = value.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    if scheme not in _SCHEMES:
        raise ValueError(
            f"must be a ZeroMQ endpoint (tcp://host:port, ipc://path, inproc://name"
            f" or host:port), got '{value}'"
        )
    if scheme == "tcp":
        split_host_port(rest, bind=bind)
    elif not rest:
        raise ValueError(f"needs a path after '{scheme}://', got '{value}'")
    return f"{scheme}://{rest}"


def normalize_http_addr(value: str) -> str:
    """Validate an HTTP listen address ``host:port`` (port 0 = ephemeral)."""
    text = value.strip()
    host, port = split_host_port(text, bind=True)
    if port is None or host == "*":
        raise ValueError(f"must be host:port with a numeric port, got '{value}'")
    return text


def normalize_host(value: str) -> str:
    """A listen host without a port (an IPv4 or IPv6 address, brackets dropped, or a name)."""
    text = value.strip()
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not host or any(c in host for c in " /[]") or (host.count(":") == 1):
        raise ValueError(f"must be a host (an address or name, no port), e.g. 127.0.0.1 or 0.0.0.0, got '{value}'")
    return host


def normalize_otlp_url(value: str) -> str:
    """`http://host:port` (or `https://`) for an OTLP gRPC collector; a bare host:port gets http://."""
    text = value.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    if scheme not in ("http", "https"):
        raise ValueError(f"must be http://host:port or https://host:port, got '{value}'")
    split_host_port(rest.rstrip("/"), bind=False)
    return f"{scheme}://{rest.rstrip('/')}"
