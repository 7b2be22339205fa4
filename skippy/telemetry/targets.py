"""Where each process of a run serves its /metrics: `<run_dir>/metrics-targets.json`.

Every process (stage, driver, broker, adapter) serves its own Prometheus /metrics and says where
in its `ready` fields (`metrics_url`). Whoever launches it (skippy.launcher) records that here, in
Prometheus's file-based service discovery format, so a Prometheus server can scrape a run with
`file_sd_configs: [{files: [RUN_DIR/metrics-targets.json]}]`, and the adapter's /dashboard reads
the same file to show the whole pipeline. Entries carry `process` (the child's name) and `url`.
With an API key every /metrics wants it as a Bearer token (the file never holds it): the dashboard
sends the adapter's, and a Prometheus job adds `authorization: {credentials_file: KEY_FILE}`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["TARGETS_FILE", "Target", "read_targets", "record_target"]

TARGETS_FILE = "metrics-targets.json"
Target = tuple[str, str]  # (process name, metrics URL)


def read_targets(path: Path) -> list[Target]:
    """(process, URL) of every entry in a targets file (none when it is missing or unreadable)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    found = []
    for entry in entries if isinstance(entries, list) else []:
        labels = entry.get("labels", {}) if isinstance(entry, dict) else {}
        if isinstance(labels, dict) and isinstance(labels.get("url"), str):
            found.append((str(labels.get("process", "")), labels["url"]))
    return found


def record_target(run_dir: Path, name: str, ready: Mapping[str, Any]) -> None:
    """Add (or replace) process `name` in `run_dir`'s targets file when its ready fields name a metrics URL."""
    url = ready.get("metrics_url")
    if not isinstance(url, str):
        return
    path = run_dir / TARGETS_FILE
    targets = [(process, u) for process, u in read_targets(path) if process != name] + [(name, url)]
    entries = []
    for process, u in targets:
        parts = urlsplit(u)
        entries.append({"targets": [parts.netloc], "labels": {"job": "skippy", "process": process, "url": u,
                                                             "__metrics_path__": parts.path or "/metrics"}})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=2) + "\n")
    tmp.replace(path)
