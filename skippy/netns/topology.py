"""Put a topology's stages on namespace hosts: stage i binds ``tcp://<address i>:<port + 10 i>``.

`place_on_hosts` rewrites a topology and its stage configs (as `skippy.launcher.write_local_topology`
writes them) in place: each stage's ``host``, ``endpoint`` and ``bind_addr`` and its neighbours'
endpoints. Stage 0 also serves requests at port + 1. `skippy up --topology` then starts each stage
in the namespace that owns its address (`skippy.netns.owner`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def place_on_hosts(topology: Path, configs: Sequence[Path], addresses: Sequence[str], port: int = 19400) -> list[str]:
    """Rewrite ``topology`` and ``configs`` so stage i is at ``addresses[i]``; returns the endpoints."""
    data = json.loads(topology.read_text())
    stages = data["stages"]
    if len(addresses) < len(stages) or len(configs) != len(stages):
        raise ValueError(f"{len(stages)} stages need as many configs and addresses, got {len(configs)} and {len(addresses)}")
    endpoints = [f"tcp://{addresses[i]}:{port + 10 * i}" for i in range(len(stages))]
    for i, stage in enumerate(stages):
        stage.update(host=addresses[i], endpoint=endpoints[i])
    topology.write_text(json.dumps(data, indent=2))
    for i, path in enumerate(configs):
        config = json.loads(path.read_text())
        config["bind_addr"] = endpoints[i]
        for side in ("upstream", "downstream"):
            if config.get(side):
                config[side]["endpoint"] = endpoints[config[side]["stage_index"]]
        path.write_text(json.dumps(config, indent=2))
    return endpoints
