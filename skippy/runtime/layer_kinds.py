"""Per-layer kinds llama.cpp derives from a GGUF's metadata, as a slice must keep them.

`swa_pattern`: which layers use the sliding window (by the full model's layer indices).
`required_layers`: per kind, the layers of each kind every slice of the family needs one of (Cohere 2:
a sliding-window layer, llama.cpp asserts one exists; LFM2: an attention and a recurrent layer, a KV
cache or recurrent memory without layers aborts its decode). `stop_block`: the block a non-final
slice appends after its own (see skippy.runtime.slices), chosen of the kind its own layers lack;
a final slice lacking one is refused (`missing_kind`, in skippy.runtime.slices.check_range).
"""

from __future__ import annotations

from skippy.runtime.families import FAMILIES
from skippy.runtime.gguf_file import GGUFFile


def swa_pattern(gguf: GGUFFile, arch: str, n_layer: int) -> list[bool] | None:
    """Per-layer `is_swa` of the full model, as llama.cpp derives it (None when it has no SWA)."""
    default_period = FAMILIES[arch].swa_period
    if not default_period or not gguf.get(f"{arch}.attention.sliding_window"):
        return None
    pattern = gguf.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return [bool(x) for x in pattern[:n_layer]]
    period = int(pattern) if isinstance(pattern, int) else default_period
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]


def _kind_layers(gguf: GGUFFile, arch: str, n_layer: int, kind: str) -> list[bool] | None:
    if kind == "sliding-window":
        return swa_pattern(gguf, arch, n_layer)
    kv = gguf.get(f"{arch}.attention.head_count_kv")
    if not isinstance(kv, list):
        return None
    return [bool(v) == (kind == "attention") for v in kv]


def required_layers(gguf: GGUFFile, arch: str, n_layer: int) -> dict[str, tuple[int, ...]]:
    """Kind -> indices of its layers, for each kind a slice of `arch` needs one layer of."""
    out = {}
    for kind in FAMILIES[arch].slice_needs:
        layers = _kind_layers(gguf, arch, n_layer, kind)
        if layers is not None and any(layers):
            out[kind] = tuple(il for il, yes in enumerate(layers) if yes)
    return out


def missing_kind(required: dict[str, tuple[int, ...]], layer_start: int, layer_end: int) -> str:
    """The first kind the slice's own layers lack ('' when it has them all)."""
    return next((k for k, layers in required.items() if not any(layer_start <= il < layer_end for il in layers)), "")


def stop_block(required: dict[str, tuple[int, ...]], layer_start: int, layer_end: int) -> int:
    """The layer copied as a non-final slice's stop block: its last layer, unless the slice then lacks a
    kind it needs; then the layer of that kind nearest to it (it never runs either way)."""
    kind = missing_kind(required, layer_start, layer_end)
    if not kind:
        return layer_end - 1
    return min(required[kind], key=lambda il: abs(il - (layer_end - 1)))
