"""A run's restart counts on /metrics: `skippy up` records every restart in `<run_dir>/restarts.json`
(skippy.restarts), and the adapter serves them at each scrape as `skippy_stage_restarts_total{stage}` and
`skippy_stage_last_restart_seconds{stage}`.

With SSH hosts the file also holds `hosts` (skippy.remote.host_loss): how many times the model was re-planned over
the hosts left (`skippy_replans_total`), each host's state (`skippy_host_dropped{host}`: 1 once it is dropped), and,
when the hosts left could not hold the model, `failed`: why, which the adapter gives every waiting request
(`pipeline_gone`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

HOSTS_STATE = "hosts"  # the key of the hosts' record in restarts.json (never a stage's record)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_restarts(path: Path) -> dict[str, dict[str, Any]]:
    """The records of a restarts.json (none when it is missing or unreadable)."""
    return {str(k): v for k, v in _read(path).items() if isinstance(v, dict) and k != HOSTS_STATE}


def read_hosts_state(path: Path) -> dict[str, Any]:
    """The hosts' record of a restarts.json ({} without SSH hosts)."""
    state = _read(path).get(HOSTS_STATE)
    return state if isinstance(state, dict) else {}


def pipeline_gone(path: Path) -> str | None:
    """Why the run's pipeline will not come back (a lost host and too little memory left), or None."""
    failed = read_hosts_state(path).get("failed")
    return failed if isinstance(failed, str) else None


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
        hosts = read_hosts_state(self.path)
        if not hosts:
            return
        replans = CounterMetricFamily("skippy_replans", "times the model was re-planned over the hosts left after"
                                      " losing one")
        replans.add_metric([], float(hosts.get("replans", 0)))
        dropped = GaugeMetricFamily("skippy_host_dropped", "1 once skippy up dropped the host (lost), else 0",
                                    labels=["host"])
        for host in hosts.get("hosts", []):
            if isinstance(host, dict) and isinstance(host.get("name"), str):
                dropped.add_metric([host["name"]], 1.0 if host.get("state") == "dropped" else 0.0)
        yield replans
        yield dropped
