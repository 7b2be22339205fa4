"""ZeroMQ, wrapped once: every socket skippy opens, and the CURVE keys that guard them.

- `queues.py`: typed asyncio PULL/PUSH and ROUTER/DEALER queues of protocol messages, each owning one
  socket with an explicit close; large activation frames go zero-copy. Start here.
- `loop_socket.py`: a ZeroMQ socket driven by the asyncio event loop through its file descriptor.
- `overflow.py`: what a bounded queue refuses (a peer that does not read): counted every time, logged once
  per episode.
- `endpoints.py`: ipc:// endpoint names and stage 0's request endpoint next to its pipeline endpoint.
- `curve_guard.py`: CURVE on every socket of a context given link keys, and the ZAP handler that refuses
  peers whose key the topology does not name (refusals and failed handshakes are logged, the peers
  remembered for that bounded).
- `curve_keys.py`: key files (`skippy keys`) and a process's `LinkKeys` from its topology.

Modules are imported by name; this file imports nothing. The guard never imports the queues.
"""
