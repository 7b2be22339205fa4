"""The admission broker: between HTTP adapters and one or more pipeline replicas.

`Broker` binds a ROUTER that speaks stage 0's request protocol, admits requests through one
FIFO `AdmissionQueue` sized by the ready pipelines, routes them to the least-loaded replica and
relays their token events back.  It holds no model.  Its settings are one
`skippy.config.AdmissionOptions`; `skippy broker` (skippy/cli/broker.py) runs it.
"""

from brokers.adaptive import AdaptiveConcurrency
from brokers.admission import AdmissionError, AdmissionQueue, AdmissionTimeout, Permit, QueueFull
from brokers.broker import Broker

__all__ = ["AdaptiveConcurrency", "AdmissionError", "AdmissionQueue", "AdmissionTimeout", "Broker", "Permit",
           "QueueFull"]
