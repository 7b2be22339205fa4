"""A run's restart counts on /metrics: `skippy up` records every restart in `<run_dir>/restarts.json`
(skippy.restarts), and the adapter serves them at each scrape as `skippy_stage_restarts_total{stage}` and
`skippy_stage_last_restart_seconds{stage}`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


def read_restarts(path: Path) -> dict[str, dict[str, Any]]:
    """The records of a restarts.json (none when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


class RestartsCollector(Collector):
    """Prometheus families read from a run's restarts.json at each scrape."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        restarts = CounterMetricFamily("skippy_stage_restarts", "stage processes restarted by skippy up",
                                       labels=["stage"])
        took = GaugeMetricFamily("skippy_stage_last_restart_seconds",
                                 "a stage's last restart: from its death to its ready line", labels=["stage"])
        for stage, record in sorted(read_restarts(self.path).items()):
            restarts.add_metric([stage], float(record.get("restarts", 0)))
            if isinstance(record.get("last_restart_seconds"), int | float):
                took.add_metric([stage], float(record["last_restart_seconds"]))
        yield restarts
        yield took
