"""Export telemetry events as OTLP spans over gRPC (opentelemetry-sdk's span model and exporter).

Each `SpanEvent` becomes an internal span without a parent: scope
`skippy-server`, the process's resource attributes (run_id, model_id, topology_id, stage_id,
stage_index, layer_start, layer_end, load_mode), and the queue's dropped and export-error counts
as attributes on every span. Trace ids are 8 bytes of the start time, then 8 of
an event counter, except for spans of a request, whose trace id is derived from the request id so
that the adapter's, the broker's and stage 0's spans of one request form one trace. The gRPC
exporter is created in the export thread on first use (connections are lazy); its 10 s timeout
bounds one export. Only this module imports opentelemetry, and only when `--metrics-otlp-grpc` is set.
Export failures are counted by the queue and logged once (`telemetry_export_failed`) until an
export succeeds again (`telemetry_export_recovered`); the exporter's own log lines are silenced.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from skippy.log import get_logger
from skippy.telemetry.events import SpanEvent

__all__ = ["OtlpSink", "request_trace_id"]

SCOPE = "skippy-server"
EXPORT_TIMEOUT_S = 10.0


def request_trace_id(request_id: str) -> int:
    """The trace id every process gives the spans of `request_id`."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:16], "big") or 1


class OtlpSink:
    def __init__(self, endpoint: str, resource: Mapping[str, str | int]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.endpoint = endpoint
        service = f"skippy-{resource.get('stage_id', 'process')}"
        self.resource = Resource.create({"service.name": service, **resource})
        self.scope = InstrumentationScope(SCOPE)
        self._exporter: Any = None
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._span_prefix = int.from_bytes(os.urandom(4), "big") << 32  # span ids unique across processes
        self._failing = False
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # its retries are counted and logged here

    def _exporter_now(self) -> Any:
        with self._lock:
            if self._exporter is None:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

                self._exporter = OTLPSpanExporter(endpoint=self.endpoint, insecure=self.endpoint.startswith("http://"),
                                                  timeout=EXPORT_TIMEOUT_S)
            return self._exporter

    def _span(self, event: SpanEvent, counters: Mapping[str, int]) -> Any:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

        n = next(self._counter)
        if event.request_id is not None:
            trace_id = request_trace_id(event.request_id)
        else:
            trace_id = ((event.start_ns & (2**64 - 1)) << 64) | n
        context = SpanContext(trace_id, self._span_prefix | n, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        attributes: dict[str, Any] = dict(event.attributes)
        if event.request_id is not None:
            attributes["request_id"] = event.request_id
        attributes["skippy.telemetry.dropped"] = counters.get("dropped", 0)
        attributes["skippy.telemetry.export_errors"] = counters.get("export_errors", 0)
        return ReadableSpan(name=event.name, context=context, parent=None, resource=self.resource, attributes=attributes,
                            kind=SpanKind.INTERNAL, start_time=event.start_ns, end_time=max(event.end_ns, event.start_ns),
                            instrumentation_scope=self.scope)

    def export(self, events: Sequence[SpanEvent], counters: Mapping[str, int]) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            spans = [self._span(event, counters) for event in events]
            ok = bool(self._exporter_now().export(spans) == SpanExportResult.SUCCESS)
        except Exception:  # noqa: BLE001 - an exporter failure is counted, never raised into the process
            ok = False
        if ok == self._failing:  # one log line when export starts failing, one when it recovers
            self._failing = not ok
            log = get_logger(component="telemetry")
            if ok:
                log.info("telemetry_export_recovered", endpoint=self.endpoint, **counters)
            else:
                log.warning("telemetry_export_failed", endpoint=self.endpoint, **counters)
        return ok

    def shutdown(self) -> None:
        with self._lock:
            exporter = self._exporter
        if exporter is not None:
            try:
                exporter.shutdown()
            except Exception:  # noqa: BLE001 - best effort at process exit
                pass
