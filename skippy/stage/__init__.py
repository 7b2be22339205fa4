"""A stage process after stage 0, and the pieces every stage shares with stage 0.

- `server`: `StageServer`, which runs this stage's layers on every batch and passes the result on.
- `worker`: the one thread that calls the runtime; `predict`: the final stage's sampling.
- `handshake`: Hello -> Ready between neighbours; `links`: the downstream link (credits from
  `credits`, the wire condition, ordered sends); `set_wire`: changing a running stage's wire condition.
- `telemetry`: a stage's observer (its metrics and spans).
"""
