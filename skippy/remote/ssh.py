"""The system OpenSSH client, as skippy reaches a host: batch mode, strict host keys, one-line failures.

`ssh_argv` is the command line for a remote command: `-T` (no terminal), `BatchMode=yes` (never a prompt: the user's
agent or the named identity file, else a refusal), `StrictHostKeyChecking=yes` (a host key that is not in
known_hosts is refused, never added), keepalives that end the session within ~6 s of the host going silent (every 2
s, 3 missed: a lost host's requests pause meanwhile), a 5 s connect timeout, and the target's port, identity file
and known_hosts file. `run_remote` runs one remote command to its end and turns SSH's own failures (exit 255:
unknown host key, login refused, no route) and a missing interpreter (127) into one line naming the host
(`RemoteError`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from typing import IO

from skippy.config.ssh_target import SshTarget
from skippy.launcher import LaunchError

__all__ = ["RemoteError", "remote_command", "run_remote", "ssh_argv"]

SSH_FAILED = 255  # what ssh exits with when SSH itself failed (not the remote command)
NOT_FOUND = 127  # the remote shell: no such command
SSH_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5",
               "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR")


class RemoteError(LaunchError):
    """A host cannot run its stage: one line naming the host, what failed and what to change."""


def remote_word(text: str) -> str:
    """`text` quoted for the remote shell; a leading `~/` stays the remote home."""
    return f'"$HOME"/{shlex.quote(text[2:])}' if text.startswith("~/") else shlex.quote(text)


def remote_command(target: SshTarget, argv: Sequence[str]) -> str:
    """The remote shell's command line: the host's Python with `argv`."""
    return " ".join([remote_word(target.python), *map(shlex.quote, argv)])


def ssh_argv(target: SshTarget, command: str) -> list[str]:
    """The local command line that runs `command` (a remote shell line) on the host."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise RemoteError("the OpenSSH client (ssh) is not installed here; skippy reaches hosts with it")
    argv = [ssh, *SSH_OPTIONS]
    if target.port is not None:
        argv += ["-p", str(target.port)]
    if target.identity_file is not None:
        argv += ["-i", os.path.expanduser(target.identity_file), "-o", "IdentitiesOnly=yes"]
    if target.known_hosts_file is not None:
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(target.known_hosts_file)}"]
    return [*argv, "--", target.destination, command]


def failure(label: str, target: SshTarget, code: int, stderr: str) -> str:
    """One line for a remote command that failed: SSH's own failures and a missing Python named as such."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {code}"
    if code == SSH_FAILED:
        known = target.known_hosts_file or "~/.ssh/known_hosts"
        if any("host key" in line.lower() or "HOST IDENTIFICATION" in line for line in lines):
            return (f"{label}: SSH refused its host key, which {known} does not hold (StrictHostKeyChecking=yes: an"
                    f" unknown key is refused, never added): verify its fingerprint, then add it there ({last})")
        if any("Permission denied" in line for line in lines):
            return (f"{label}: SSH login refused ({last}): BatchMode=yes never prompts; use the agent or the hosts"
                    " file's ssh.identity_file, whose public key the host must authorize")
        return f"{label}: cannot reach it over SSH: {last}"
    if code == NOT_FOUND:
        return f"{label}: {target.python} is not there ({last}); set ssh.python in the hosts file to its Python"
    return f"{label}: {last}"


def run_remote(target: SshTarget, label: str, argv: Sequence[str], *, stdin: IO[bytes] | None = None,
               timeout_s: float | None = 120.0) -> str:
    """Run the host's Python with `argv` to its end; its stdout, or RemoteError with one line."""
    command = ssh_argv(target, remote_command(target, argv))
    try:
        done = subprocess.run(command, stdin=stdin if stdin is not None else subprocess.DEVNULL, capture_output=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{label}: no answer over SSH within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise RemoteError(failure(label, target, done.returncode, done.stderr.decode(errors="replace")))
    return done.stdout.decode(errors="replace")
