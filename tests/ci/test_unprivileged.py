"""CI runs where a contributor runs it: the suite's fast subset passes as an unprivileged user, saying what it skips.

As root (as on CI) `scripts/test-unprivileged` drops to `nobody` (setpriv, no groups, HOME and caches in a
fresh temp dir) and runs tests/config and tests/netns (but the Gemma model runs): they pass,
and the namespace tests skip naming why. `scripts/setup-browser`, which `.ci/run` runs first under `set -e`,
exits 0 saying why when it cannot install (not root, no apt-get), and fails when an install as root fails. Not root, these tests
skip (the suite already runs unprivileged then).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_WITHIN_S = 600  # a bound on the subset's run (it takes seconds), not a timing claim

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="dropping to an unprivileged user needs root (this run already is one)"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not found"),
]


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_WITHIN_S, check=False)


def test_fast_subset_passes_as_nobody_and_names_its_skips() -> None:
    # the packaged Gemma's runs (about 35 s) run as root in the suite itself; what this checks is permissions and paths
    done = _run("scripts/test-unprivileged", "tests/config", "tests/netns", "-q", "-k", "not gemma")
    out = done.stdout + done.stderr
    if done.returncode == 2 and "cannot run" in done.stderr and "can stand in" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, out[-4000:]
    assert "as nobody (uid 65534" in done.stderr, out[-4000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, out[-4000:]
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert any("network namespaces need root" in line for line in skips), out[-4000:]


def test_setup_browser_without_root_or_apt_get_says_why_and_succeeds(tmp_path: Path) -> None:
    absent = {"CHROMIUM": str(tmp_path / "no-chromium"), "PATH": "/usr/bin:/bin"}
    as_nobody = _run("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "scripts/setup-browser", env=absent)
    assert as_nobody.returncode == 0 and "skipped: not root (uid 65534)" in as_nobody.stderr, as_nobody
    bare = tmp_path / "bin"  # a PATH with `id` and no apt-get
    bare.mkdir()
    (bare / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    no_apt = _run("/bin/bash", "scripts/setup-browser", env={**absent, "PATH": str(bare)})
    assert no_apt.returncode == 0 and "skipped: no apt-get on PATH" in no_apt.stderr, no_apt


def test_setup_browser_as_root_fails_when_the_install_fails(tmp_path: Path) -> None:
    fake = tmp_path / "bin"  # an apt-get that fails as a broken mirror would: the script must fail too
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package chromium' >&2\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    env = {"CHROMIUM": str(tmp_path / "no-chromium"), "PATH": f"{fake}:/usr/bin:/bin"}
    done = _run("scripts/setup-browser", env=env)
    assert done.returncode == 100 and "Unable to locate package" in done.stderr, done
