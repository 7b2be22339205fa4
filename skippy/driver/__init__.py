"""Stage 0, the driver: admits requests, schedules iterations and keeps micro-batches in flight.

Start at `driver.py`, the step loop; each other module is one part it is built from.

- `driver.py`: `Driver`, the step loop: plan an iteration, launch it, post-process what comes back, deliver.
- `process.py`: stage 0 as a process (`DriverProcess`); `requests.py`: the ROUTER clients submit on
  (`RequestEndpoint`, answered through `Stage0`); `submission.py`: what a Submit is checked for before it
  becomes a sequence, and the bounded `WaitingRoom`.
- `cell_pool.py`: the KV pool's account (`CellPool`): admission waits for a request's cells, prefix cache entries
  give theirs back, the youngest sessions are preempted when decoding outgrows the pool.
- `sequence.py`: a `Sequence` per request and the `SequenceTable` (the only place their state changes);
  `scheduler.py`: `plan_iteration`, decode rows first, then prefill chunks (sized by `prefill.py`) within
  `n_batch`.
- `batches.py`: the `BatchLauncher` (stage 0's layers, then the wire; the micro-batches in flight);
  `postprocess.py`: predictions -> committed tokens, events, finishes; `delivery.py`: `Delivery`, a returned
  batch's outcomes onto its requests' handles, and the one way a request ends (finish, fail);
  `releases.py`: `SessionReleases`, finished sessions forgotten on every stage.
- `inbound.py`: what comes back on stage 0's PULL, read with the parts it needs and told to the driver
  through `DriverCallbacks`; `liveness.py`: which
  downstream stages are alive, from their heartbeats; `replay.py`: the requests in flight paused when a later
  stage dies, and replayed once the chain is back.
- `verify_costs.py`: the verify window's cost calibration at startup; `wire_certify.py`: the activation wire
  format certified at startup against f32; `prefix_index.py`: the prefix cache index (stage 0 decides).
- `direct_events.py`: token events pushed straight to the adapter (bounded per endpoint); `telemetry.py`:
  stage 0's observer.
- `speculative/`: proposers, window policies and the per-session engine.

Requests arrive as `skippy.protocol.Submit` (from `skippy.client.PipelineClient`, or the broker) and
leave as `skippy.protocol.TokenEvents`, one per request per step.
"""
