"""Authenticated, encrypted stage links: ZeroMQ CURVE with the keys a topology names.

`skippy.curve.guard` puts CURVE on every socket of a context that `secure` was given keys for (the
queues of skippy.transport ask it) and refuses peers whose key the topology does not name (a ZAP
handler; refusals and failed handshakes are logged). `skippy.curve.keys` reads and writes key files
and builds a process's `LinkKeys` from its topology. The package's modules are imported by name
(this file imports nothing): skippy.transport needs the guard, the guard must not need transport.
"""
