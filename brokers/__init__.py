"""The admission broker: between HTTP adapters and one or more pipeline replicas.

`Broker` binds a ROUTER that speaks stage 0's request protocol, admits requests through one
FIFO `AdmissionQueue` sized by the ready pipelines, routes them to the least-loaded replica and
relays their token events back.  It holds no model.  Its settings are one
`skippy.config.AdmissionOptions`; `skippy broker` (flags in skippy.cli.broker) runs it. Start at `broker.py`.

- `broker.py`: `Broker`: the ROUTER adapters submit on, admission, routing, relaying events, refusals.
- `broker_main.py`: the broker process (`skippy broker`'s main): sockets, CURVE, /metrics, SIGTERM.
- `admission.py`: `AdmissionQueue`: execution permits and a bounded FIFO wait queue (pure asyncio).
- `adaptive.py`: `AdaptiveConcurrency`, opt-in: probe one more permit, keep it only if throughput pays.
- `pool.py`: the pipeline replicas: Status polling, readiness, capacity and least-loaded routing.
- `link.py`: `PipelineLink`, one replica as the broker sees it: a DEALER to its stage 0 request endpoint.
- `prefix_routing.py`: prefix affinity, a prompt sent to the replica its beginning went to before.
- `held_requests.py`: `RequestLedger`, the requests held from Submit to final event: their cancels, how each ends.
- `relay.py`: `AdapterRelay`, the sends to adapters: bounded, and never dropped in silence.
- `telemetry.py`: `BrokerTelemetry`, the broker's observer: /metrics and a span per request.
"""

from brokers.adaptive import AdaptiveConcurrency
from brokers.admission import AdmissionError, AdmissionQueue, AdmissionTimeout, Permit, QueueFull
from brokers.broker import Broker

__all__ = ["AdaptiveConcurrency", "AdmissionError", "AdmissionQueue", "AdmissionTimeout", "Broker", "Permit",
           "QueueFull"]
