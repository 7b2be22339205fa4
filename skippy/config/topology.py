"""The pipeline topology: every stage of one pipeline, in order, and the rules on its link keys.

``StageTopology`` lists each stage's id, endpoint and contiguous layer range (``StageTopologyEntry``),
the non-stage clients allowed on keyed links and where this machine keeps its secret keys. Link keys
(skippy.config.link_keys) are all or nothing: every stage names a CURVE public key, or none does; a
topology whose stages are reached beyond loopback must have keys unless a process is told
``--insecure-links`` (`insecure_problem`). Loads from JSON with errors naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path

from skippy.config.endpoint import normalize_zmq_endpoint
from skippy.config.errors import ConfigError, FieldError
from skippy.config.link_keys import LinkClient, check_public_key, non_loopback
from skippy.config.schema import ConfigModel, check, show

__all__ = ["LoadMode", "StageTopology", "StageTopologyEntry", "check_layer_range", "check_topology_keys",
           "insecure_problem", "normalize_endpoint", "require_text", "secret_key_path", "with_keys_dir"]


class LoadMode(enum.StrEnum):
    RUNTIME_SLICE = "runtime-slice"  # slice the full GGUF (cached), load only owned layers
    ARTIFACT_SLICE = "artifact-slice"  # load a pre-sliced GGUF
    LAYER_PACKAGE = "layer-package"  # directories of layer packages (model-package.json): refused



def require_text(obj: object, *names: str) -> None:
    """Each named str field of `obj` is None or not blank."""
    for name in names:
        value = getattr(obj, name)
        check(value is None or value.strip() != "", name, "must not be empty")


def normalize_endpoint(obj: object, name: str, *, bind: bool) -> None:
    """Replace the ZeroMQ endpoint field `name` of a frozen config with its normal form."""
    try:
        normalized = normalize_zmq_endpoint(getattr(obj, name), bind=bind)
    except ValueError as error:
        raise FieldError(name, str(error)) from None
    object.__setattr__(obj, name, normalized)


def check_layer_range(start: int, end: int) -> None:
    check(start < end, "layer_end", f"must be > layer_start ({start}), got {end}")


@dataclass(frozen=True, kw_only=True)
class StageTopologyEntry(ConfigModel):
    """One stage as the topology describes it."""

    stage_id: str
    stage_index: int
    host: str | None = None
    endpoint: str
    layer_start: int
    layer_end: int
    load_mode: LoadMode
    public_key: str | None = None  # CURVE public key (Z85) of the stage's links; see skippy.config.link_keys

    def _check(self) -> None:
        require_text(self, "stage_id", "host")
        normalize_endpoint(self, "endpoint", bind=False)
        check_layer_range(self.layer_start, self.layer_end)
        check_public_key(self.public_key, "public_key")


@dataclass(frozen=True)
class StageTopology(ConfigModel):
    """Every stage of one pipeline, in order, covering contiguous layer ranges."""

    topology_id: str
    model_id: str
    stages: tuple[StageTopologyEntry, ...]
    clients: tuple[LinkClient, ...] = ()  # non-stage processes allowed on keyed links (broker, tools)
    keys_dir: str | None = None  # where this machine's secret keys are, relative to the topology file

    def _check(self) -> None:
        require_text(self, "topology_id", "model_id")
        check(len(self.stages) > 0, "stages", "must not be empty")
        seen: dict[str, int] = {}
        for i, stage in enumerate(self.stages):
            at = f"stages[{i}]"
            got = stage.stage_index
            check(got == i, f"{at}.stage_index", f"must be {i}, got {got}")
            first = seen.setdefault(stage.stage_id, i)
            reason = f"duplicates stages[{first}] ({show(stage.stage_id)})"
            check(first == i, f"{at}.stage_id", reason)
            expected = 0 if i == 0 else self.stages[i - 1].layer_end
            source = "0" if i == 0 else f"stages[{i - 1}].layer_end ({expected})"
            check(
                stage.layer_start == expected,
                f"{at}.layer_start",
                f"must equal {source}, got {stage.layer_start}",
            )
        check_topology_keys(self)

    def entry(self, stage_id: str) -> StageTopologyEntry:
        """The entry for ``stage_id``; KeyError if absent."""
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"stage {stage_id!r} is not in topology {self.topology_id!r}")

    def first(self) -> StageTopologyEntry:
        return self.stages[0]

    def final(self) -> StageTopologyEntry:
        return self.stages[-1]

    def next_of(self, stage_index: int) -> StageTopologyEntry | None:
        """The stage after ``stage_index`` (None for the final stage)."""
        if not 0 <= stage_index < len(self.stages):
            raise IndexError(f"stage_index {stage_index} is outside 0..{len(self.stages) - 1}")
        return self.stages[stage_index + 1] if stage_index + 1 < len(self.stages) else None


def check_topology_keys(topology: StageTopology) -> None:
    """All stages keyed or none; clients and keys_dir only with keys; every key distinct."""
    keyed = [s.public_key is not None for s in topology.stages]
    if any(keyed) and not all(keyed):
        missing = keyed.index(False)
        check(False, f"stages[{missing}].public_key",
              "is missing: once one stage has a public key every stage needs one (`skippy keys --topology FILE`)")
    if not any(keyed):
        check(not topology.clients, "clients", "need the stages' public keys too")
        check(topology.keys_dir is None, "keys_dir", "needs the stages' public keys too")
        return
    check(topology.keys_dir is None or topology.keys_dir.strip() != "", "keys_dir", "must not be empty")
    names = [s.stage_id for s in topology.stages]
    keys = [s.public_key for s in topology.stages]
    for i, client in enumerate(topology.clients):
        check(client.name not in names, f"clients[{i}].name", f"{client.name!r} is already a name in this topology")
        names.append(client.name)
        keys.append(client.public_key)
    for i, key in enumerate(keys):
        check(keys.index(key) == i, "public_key", f"{names[i]} has the same key as {names[keys.index(key)]}")


def with_keys_dir(topology: StageTopology, path: str | Path) -> StageTopology:
    """`topology` (loaded from `path`) with its keys_dir made absolute, so copies of it still find the keys."""
    if topology.keys_dir is None:
        return topology
    return dataclasses.replace(topology, keys_dir=str((Path(path).parent / topology.keys_dir).resolve()))


def secret_key_path(topology: StageTopology | None, name: str, override: str | None = None) -> Path | None:
    """This process's secret key file: `override`, else `<keys_dir>/<name>.key_secret` of a keyed topology."""
    if override is not None:
        return Path(override)
    if topology is None or topology.first().public_key is None:
        return None
    if topology.keys_dir is None:
        raise ConfigError(f"topology {topology.topology_id!r} names public keys but no keys_dir: "
                          "pass --link-secret-key or add keys_dir")
    return Path(topology.keys_dir) / f"{name}.key_secret"


def insecure_problem(topology: StageTopology | None, bind_addr: str, insecure_links: bool) -> str | None:
    """Why this process must not start: plain links beyond loopback without `--insecure-links`."""
    if insecure_links or (topology is not None and topology.first().public_key is not None):
        return None
    endpoints = [s.endpoint for s in topology.stages] if topology is not None else []
    exposed = [e for e in [bind_addr, *endpoints] if non_loopback(e)]
    if not exposed:
        return None
    where = f"topology {topology.topology_id!r}" if topology is not None else "this stage"
    return (f"{where} uses non-loopback address {exposed[0]} without link keys: run `skippy keys --topology FILE`"
            " to authenticate and encrypt the stage links, or pass --insecure-links to run them in the clear")
