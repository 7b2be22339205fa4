"""A real OTLP gRPC trace receiver for tests: grpcio + opentelemetry-proto's TraceService servicer.

`OtlpReceiver()` listens on 127.0.0.1 at an ephemeral port and keeps every span it is sent, with
its resource attributes. `stalled=True` makes every Export wait (until `close()`) instead of
answering: a collector that accepts connections and never replies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    resource: dict[str, Any]
    attributes: dict[str, Any]
    trace_id: bytes
    start_ns: int
    end_ns: int


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, stalled: bool = False) -> None:
        self.stalled = stalled
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self._changed = threading.Condition()
        self._release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any) -> Any:  # noqa: N802 - gRPC's name
        with self._changed:
            self.exports += 1
            self._changed.notify_all()
        if self.stalled:
            self._release.wait()
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(span.name, resource, {a.key: _value(a.value) for a in span.attributes},
                                                 span.trace_id, span.start_time_unix_nano, span.end_time_unix_nano))
        with self._changed:
            self.spans.extend(received)
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], timeout_s: float) -> bool:
        """Wait (bounded) until `predicate(self)` holds, re-checked whenever spans or exports arrive."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def snapshot(self) -> list[ReceivedSpan]:
        with self._changed:
            return list(self.spans)

    def close(self) -> None:
        self._release.set()
        self.server.stop(grace=None)
