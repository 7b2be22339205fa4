"""Reading the pipeline's /metrics back: scrape each process, merge, summarise for the dashboard.

`scrape` fetches one Prometheus text page (bounded by a timeout; None when the process does not
answer), with the run's API key as a Bearer token when there is one; `summarise` turns the merged
samples of every process into the numbers the dashboard shows. Counters stay cumulative (the page
computes rates between two polls); gauges are as read.
Each stage's utilisation comes from its own `skippy_stage_compute_seconds` when its process is
scraped, else from the driver's view of it (`skippy_pipeline_stage_compute_seconds_total`). Its prefill rate:
the driver's prompt tokens (`prefill_tokens`, the same for every stage) over the stage's compute on the batches
that carried them (`prefill_compute_seconds`). The
adapter's request count leaves out the dashboard's own routes (its page polls every second).
Speculation: each running session's k and alpha (stage 0's `skippy_speculative_session_*`), and the
adapter's llama-server counters: verify windows and accepted drafts per position (rate = accepted at
position i / windows).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Sample", "parse", "scrape", "summarise"]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    return [Sample(s.name, s.labels, float(s.value)) for family in text_string_to_metric_families(text)
            for s in family.samples]


def scrape(url: str, timeout_s: float = 1.0, api_key: str | None = None) -> list[Sample] | None:
    """The samples of one /metrics page (None: no answer within `timeout_s`, a refusal, or not Prometheus
    text); `api_key` goes as `Authorization: Bearer`."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - URLs from our own run dir
            return parse(response.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def _total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _has(samples: Iterable[Sample], name: str) -> bool:
    return any(s.name == name for s in samples)


def _fields(samples: Sequence[Sample], names: Mapping[str, str], **labels: str) -> dict[str, float]:
    return {key: _total(samples, name, **labels) for key, name in names.items()}


ADAPTER = {"requests": "skippy_http_requests_total", "errors": "skippy_request_errors_total",
           "prompt_tokens": "skippy_prompt_tokens_total", "completion_tokens": "skippy_completion_tokens_total",
           "ttft_sum": "skippy_time_to_first_token_seconds_sum", "ttft_count": "skippy_time_to_first_token_seconds_count",
           "tpot_sum": "skippy_time_per_output_token_seconds_sum", "tpot_count": "skippy_time_per_output_token_seconds_count",
           "spec_proposed": "skippy_speculative_proposed_total", "spec_accepted": "skippy_speculative_accepted_total"}
PIPELINE = {"ready": "skippy_pipeline_ready", "running": "skippy_requests_running", "waiting": "skippy_requests_waiting",
            "concurrency": "skippy_generation_concurrency"}
BROKER = {"queue_depth": "skippy_broker_queue_depth", "running": "skippy_broker_running",
          "concurrency": "skippy_broker_concurrency", "admitted": "skippy_broker_admitted_total",
          "rejected_429": "skippy_broker_rejected_429_total"}
DRIVER = {"running": "skippy_driver_sessions_running", "waiting": "skippy_driver_sessions_waiting",
          "in_flight": "skippy_driver_micro_batches_in_flight", "in_flight_limit": "skippy_driver_micro_batches_limit",
          "decode_tokens": "skippy_driver_decode_tokens_total", "prefill_tokens": "skippy_driver_prefill_tokens_total",
          "iterations": "skippy_driver_iterations_total", "spec_proposed": "skippy_driver_speculative_proposed_total",
          "spec_accepted": "skippy_driver_speculative_accepted_total"}
STAGE = {"compute_seconds": "skippy_stage_compute_seconds_sum", "batches": "skippy_stage_batch_rows_count",
         "rows": "skippy_stage_batch_rows_sum", "queue_depth": "skippy_stage_queue_depth", "kv_cells": "skippy_stage_kv_cells",
         "sessions": "skippy_stage_sessions", "credit_wait_seconds": "skippy_stage_credit_wait_seconds_total"}
TELEMETRY = {"queued": "skippy_telemetry_events_queued_total", "sent": "skippy_telemetry_events_sent_total",
             "dropped": "skippy_telemetry_events_dropped_total", "export_errors": "skippy_telemetry_export_errors_total"}


def _stages(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    own = {s.labels["stage_id"] for s in samples if s.name.startswith("skippy_stage_") and "stage_id" in s.labels}
    seen = {s.labels["stage_id"] for s in samples if s.name == "skippy_pipeline_stage_compute_seconds_total"}
    stages: dict[str, dict[str, float]] = {}
    for stage_id in sorted(own | seen):
        if stage_id in own:
            stage = _fields(samples, STAGE, stage_id=stage_id)
            for direction in ("in", "out"):
                stage[f"bytes_{direction}"] = _total(samples, "skippy_stage_activation_bytes_total", stage_id=stage_id,
                                                     direction=direction)
        else:
            stage = {"compute_seconds": _total(samples, "skippy_pipeline_stage_compute_seconds_total", stage_id=stage_id)}
        stage["prefill_compute_seconds"] = _total(samples, "skippy_pipeline_stage_prefill_compute_seconds_total",
                                                  stage_id=stage_id)
        stage["prefill_tokens"] = _total(samples, DRIVER["prefill_tokens"])
        stage["scraped"] = float(stage_id in own)
        stages[stage_id] = stage
    return stages


def _api_requests(samples: Iterable[Sample]) -> float:
    """The adapter's HTTP requests but the dashboard's own."""
    return sum(s.value for s in samples if s.name == ADAPTER["requests"]
               and not s.labels.get("route", "").startswith("/dashboard"))


def _wire(samples: Sequence[Sample]) -> dict[str, Any] | None:
    """The activation wire's startup verdict, as the adapter exports it (None: not known)."""
    info = next((s.labels for s in samples if s.name == "skippy_activation_wire" and s.value), None)
    if info is None:
        return None
    agreement = {s.labels["dtype"]: s.value for s in samples if s.name == "skippy_activation_wire_agreement"}
    return {**info, "agreement": agreement}


def _speculation(samples: Sequence[Sample]) -> dict[str, Any]:
    """Running sessions' k and alpha (by session id) and the accepted drafts per position since startup."""
    alpha = {s.labels["session"]: s.value for s in samples if s.name == "skippy_speculative_session_alpha"}
    sessions = [{"session": s.labels["session"], "k": s.value, "alpha": alpha.get(s.labels["session"], 0.0)}
                for s in samples if s.name == "skippy_speculative_session_k"]
    per_pos = {int(s.labels["position"]): s.value for s in samples
               if s.name == "skippy_spec_decode_num_accepted_tokens_per_pos_total" and "position" in s.labels}
    return {"sessions": sessions, "drafts": _total(samples, "skippy_spec_decode_num_drafts_total"),
            "accepted_per_pos": [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []}


def summarise(processes: Sequence[tuple[str, str, list[Sample] | None]]) -> dict[str, Any]:
    """The dashboard's numbers from every process's samples: (process, URL, samples or None when down)."""
    samples = [s for _name, _url, got in processes for s in (got or [])]
    return {
        "time": time.time(),
        "processes": [{"process": name, "url": url, "up": got is not None} for name, url, got in processes],
        "adapter": {**_fields(samples, ADAPTER), "requests": _api_requests(samples)},
        "pipeline": _fields(samples, PIPELINE),
        "broker": _fields(samples, BROKER) if _has(samples, "skippy_broker_queue_depth") else None,
        "driver": _fields(samples, DRIVER) if _has(samples, "skippy_driver_sessions_running") else None,
        "stages": _stages(samples),
        "telemetry": _fields(samples, TELEMETRY),
        "wire": _wire(samples),
        "speculation": _speculation(samples),
    }
