"""`skippy logs RUN_DIR`: merge the JSON logs of every process of a run in time order.

Filters: `--request ID`, `--stage ID`, `--event NAME` (repeatable). On a terminal lines are
readable and coloured by level; `--json` prints the raw JSON lines; `--follow` keeps reading.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

COLORS = {"debug": "\033[2m", "info": "", "warning": "\033[33m", "error": "\033[31m", "critical": "\033[31;1m"}
RESET = "\033[0m"
HEAD = ("ts", "level", "event", "stage_id", "request_id", "session_id")


def _events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    events = []
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # leave a partly written last line for the next read
    for line in data[:end].splitlines():
        if line.startswith(b"{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event.setdefault("stage_id", path.stem)
            events.append(event)
    return events, offset + end


def _wanted(event: dict[str, Any], args: argparse.Namespace) -> bool:
    if args.request and event.get("request_id") not in args.request:
        return False
    if args.stage and event.get("stage_id") not in args.stage:
        return False
    return not args.event or event.get("event") in args.event


def format_event(event: dict[str, Any], color: bool) -> str:
    at = float(event.get("ts", 0))
    ts = time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
    level = str(event.get("level", "info"))
    ids = " ".join(f"{k}={event[k]}" for k in ("request_id", "session_id") if event.get(k) is not None)
    rest = " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in event.items() if k not in HEAD)
    line = f"{ts} {level:<7} {str(event.get('stage_id', '?')):<10} {event.get('event', '')}  {ids} {rest}".rstrip()
    return f"{COLORS.get(level, '')}{line}{RESET}" if color and COLORS.get(level) else line


def merged(run_dir: Path) -> Iterator[dict[str, Any]]:
    streams = [_events(p)[0] for p in sorted(run_dir.glob("*.log"))]
    return heapq.merge(*streams, key=lambda e: float(e.get("ts", 0)))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="merge a run directory's JSON logs in time order")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--request", action="append", help="only this request id (repeatable)")
    p.add_argument("--stage", action="append", help="only this stage id (repeatable)")
    p.add_argument("--event", action="append", help="only this event name (repeatable)")
    p.add_argument("--json", action="store_true", help="raw JSON lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        print(f"skippy logs: error: run directory not found: {args.run_dir}", file=sys.stderr)
        return 2
    color = sys.stdout.isatty() and not args.json
    show = (lambda e: json.dumps(e)) if args.json else (lambda e: format_event(e, color))
    for event in merged(args.run_dir):
        if _wanted(event, args):
            print(show(event), flush=False)
    sys.stdout.flush()
    if not args.follow:
        return 0
    offsets = {p: p.stat().st_size for p in args.run_dir.glob("*.log")}
    while True:
        time.sleep(0.2)
        fresh: list[dict[str, Any]] = []
        for path in args.run_dir.glob("*.log"):
            events, offsets[path] = _events(path, offsets.get(path, 0))
            fresh += events
        for event in sorted(fresh, key=lambda e: float(e.get("ts", 0))):
            if _wanted(event, args):
                print(show(event), flush=True)
