"""`scripts/dashboard-screenshot`: a picture of /dashboard while `skippy up` serves a steady load.

Starts `skippy up` (default: SmolLM2-135M-Instruct over 2 stages, `--split 15`, so the page shows a link; other
`skippy up` flags may follow `--`, in place of that default),
keeps `--streams` completions running, opens the page in headless Chromium, waits until it has
polled `--polls` times, saves a PNG (default docs/dashboard.png) and stops everything.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from skippy.testing.browser import chromium_missing, headless_chromium, load, text_of

READY_PREFIX = "skippy ready: "


def start_up(run_dir: Path, flags: list[str]) -> tuple[subprocess.Popen[str], str, str]:
    """`skippy up` on an ephemeral port; (process, base URL, model id) once it said ready."""
    proc = subprocess.Popen([sys.executable, "-m", "skippy.cli.main", "up", "--bind", "127.0.0.1:0", "--run-dir",
                             str(run_dir), *flags], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY_PREFIX):
            base = line[len(READY_PREFIX):].split()[0].removesuffix("/v1")
            return proc, base, line.split("(model ", 1)[1].split(")", 1)[0]
    raise SystemExit(f"skippy up exited with {proc.wait()} before ready (logs: {run_dir})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/dashboard-screenshot", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--streams", type=int, default=4, help="concurrent completions (default 4)")
    parser.add_argument("--polls", type=int, default=60, help="page updates (1 s apart) before the picture (default 60)")
    parser.add_argument("up_flags", nargs="*", default=["--split", "15"],
                        help="after --: flags for skippy up (default: --split 15, the default model over 2 stages)")
    args = parser.parse_args(argv)
    missing = chromium_missing()
    if missing is not None:
        print(f"dashboard-screenshot: {missing}", file=sys.stderr)
        return 2
    from selenium.webdriver.support.ui import WebDriverWait

    with tempfile.TemporaryDirectory(prefix="skippy-dashboard-") as tmp:
        proc, base, model_id = start_up(Path(tmp) / "run", args.up_flags)
        try:
            _wait_ready(base, 120.0)
            with load(base, model_id, streams=args.streams, max_requests=10_000, max_tokens=64), \
                    headless_chromium(1280, 1180) as browser:
                browser.get(f"{base}/dashboard")
                WebDriverWait(browser, 60 + 2 * args.polls).until(lambda d: int(text_of(d, "updates")) >= args.polls)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(str(args.out))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    print(f"wrote {args.out}")
    return 0


def _wait_ready(base: str, timeout_s: float) -> None:
    """Bounded poll of /readyz until it answers 200 (the broker learns readiness by polling stage 0)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{base}/readyz not 200 within {timeout_s:g} s")


if __name__ == "__main__":
    sys.exit(main())
