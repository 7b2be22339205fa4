"""How a host of a hosts file is reached over SSH: its `ssh` entry, checked.

`"ssh": "user@host"` or an object: `destination` (`user@host`, required), `port`, `identity_file`,
`known_hosts_file` (default: the user's own known_hosts), `python` (the interpreter that has skippy there,
default `python3`), `cache_dir` (skippy's cache there, `SKIPPY_CACHE_DIR`; default `~/.cache/skippy`) and
`model_path` (the model's GGUF already on that host: its stages slice it there instead of receiving their
slices). The OpenSSH client reaches it in batch mode with strict host key checking (skippy.remote.ssh).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from skippy.config.errors import ConfigError

__all__ = ["SshTarget", "parse_ssh_target"]


@dataclass(frozen=True)
class SshTarget:
    destination: str  # user@host, or host (the SSH user's own default user)
    port: int | None = None
    identity_file: str | None = None
    known_hosts_file: str | None = None
    python: str = "python3"
    cache_dir: str = "~/.cache/skippy"
    model_path: str | None = None

    @property
    def hostname(self) -> str:
        return self.destination.rpartition("@")[2].strip("[]")

    def describe(self) -> str:
        return f"ssh {self.destination}" + (f" -p {self.port}" if self.port else "")


def _text(value: object, field: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value) or value.startswith("-"):
        raise ConfigError(f"{where}.{field} must be a non-empty string without spaces, not starting with '-';"
                          f" got {value!r}")
    return value


def parse_ssh_target(value: object, where: str) -> SshTarget:
    """A hosts-file entry's `ssh` value (`where` names it, e.g. `hosts.json: hosts[1].ssh`), or ConfigError."""
    entry = {"destination": value} if isinstance(value, str) else value
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be \"user@host\" or an object, got {type(value).__name__}")
    known = [f.name for f in fields(SshTarget)]
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]} is not an ssh field (known: {', '.join(known)})")
    if "destination" not in entry:
        raise ConfigError(f"{where}.destination is missing (\"user@host\")")
    port = entry.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise ConfigError(f"{where}.port must be a port number (1-65535), got {port!r}")
    texts = {name: _text(entry[name], name, where) for name in known if name != "port" and entry.get(name) is not None}
    target = SshTarget(port=port, **texts)
    if not target.hostname:
        raise ConfigError(f"{where}.destination has no host after '@': {target.destination!r}")
    return target
