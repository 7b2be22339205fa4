"""Stage 0, the driver: admits requests, schedules iterations and keeps micro-batches in flight.

- `driver`: the step loop (`Driver`); `process`: stage 0 as a process; `requests`: the ROUTER clients submit
  on (`RequestEndpoint`, answered through `Stage0`).
- `sequence`: a `Sequence` per request and the `SequenceTable` (the only place their state changes);
  `scheduler`: `plan_iteration`, decode rows first, then prefill chunks (`prefill`) within `n_batch`.
- `batches`: the `BatchLauncher` (stage 0's layers, then the wire; the micro-batches in flight);
  `postprocess`: predictions -> committed tokens, events, finishes.
- `inbound`: what comes back on stage 0's PULL, answered through `DriverCallbacks`; `liveness`:
  heartbeats; `calibrate`: the verify window's cost calibration; `wire_certify`: the activation wire
  format certified at startup against f32; `prefix_index`: the prefix cache index.
- `direct_events`: token events pushed straight to the adapter (bounded per endpoint); `telemetry`: stage 0's
  observer.
- `speculative/`: proposers, window policies and the per-session engine.

Requests arrive as `skippy.protocol.Submit` (from `skippy.client.PipelineClient`, or the broker) and
leave as `skippy.request_events.RequestEvent`s.
"""
