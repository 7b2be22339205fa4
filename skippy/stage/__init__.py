"""A stage process after stage 0, and the pieces every stage shares with stage 0.

- `server.py`: `StageServer`, which runs this stage's layers on every batch and passes the result on; start here.
- `worker.py`: the one thread that calls the runtime, and a stage's compute on a batch; `final_sampling.py`:
  the final stage's sampling, verify windows row by row.
- `handshake.py`: Hello -> Ready between neighbours; `links.py`: the downstream link (credits from
  `credits.py`, the wire condition, ordered sends); `set_wire.py`: changing a running stage's wire condition.
- `telemetry.py`: a later stage's observer (its metrics and spans).
"""
