"""Slice GGUF writer: the tensors and metadata one stage needs for `[layer_start, layer_end)`.

A slice holds the owned `blk.N.*` tensors renumbered from 0, every non-block tensor (llama.cpp
requires the embedding and output tensors to exist), and all metadata with `block_count` set and
per-layer metadata cut to the range. Layer-index-keyed behaviour is pinned to the original layer
numbers: for the sliding-window families (Gemma 3, Cohere 2) the pattern is written as a per-layer
array computed from the original indices, otherwise a slice starting at layer 9 silently treats the
wrong layers as global; per-layer arrays (LFM2's head_count_kv, which marks its recurrent layers) are
cut likewise. A later slice drops the family's token-embedding scales (Granite's embedding_scale:
llama.cpp would scale the incoming hidden state too). What each family needs: skippy.runtime.families.

A non-final slice gets one extra *stop block* (a copy of its last block, or of a layer of the kind its family
needs in every slice: skippy.runtime.layer_kinds). llama.cpp drops the rows
not flagged as outputs inside the last block of a graph; with the stop block appended, the real last
block computes every row, the runtime reads its `l_out` and stops the graph there, so the stop block
and the vocabulary projection never run and no `n_rows x n_vocab` logits buffer is needed.

The embedding and output tensors a stage never reads are written as zeros, left as holes (`unused_tensors`): a
later slice's token embedding (its input is a hidden state; kept where the final slice's output is the tied
embedding or its NextN blocks embed the drafted token) and a non-final slice's output matrix (its graph stops before
the head). On disk the file is sparse, and shipping sends only its data (skippy.remote.shipping); llama.cpp maps
them and never touches those pages. `skippy.slice.zeroed` names them. A model's *skeleton* (`write_skeleton`) has
every tensor zeros: a host times the model on it (skippy.plan.calibrate) without being sent the weights.

NextN (MTP) blocks (`{arch}.nextn_predict_layers`, counted in llama.cpp's block_count after the trunk) belong
to no stage's trunk range: `ModelInfo.n_layer` is the trunk, and the final slice carries the NextN blocks
after its own (renumbered, `nextn_predict_layers` kept), so its stage can draft from them (docs/mtp.md);
earlier slices drop them and the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from skippy.runtime.errors import ModelError
from skippy.runtime.families import FAMILIES, split_point_problem, supported_architectures, unsupported_message
from skippy.runtime.gguf_file import ARRAY, BOOL, STRING, UINT32, GGUFFile, TensorInfo, pack_entry, write_gguf
from skippy.runtime.layer_kinds import missing_kind, required_layers, stop_block, swa_pattern

SUPPORTED_ARCHITECTURES = supported_architectures()
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ModelInfo:
    """What the runtime needs to know about a full GGUF before slicing it."""

    path: Path
    architecture: str
    n_layer: int
    n_embd: int
    required_layers: dict[str, tuple[int, ...]] = field(default_factory=dict)  # kind -> layers: a slice needs
    # one of each kind (skippy.runtime.layer_kinds)
    n_nextn: int = 0  # NextN (MTP) blocks after the trunk's n_layer (blk.{n_layer}.nextn.*)

    @property
    def n_block(self) -> int:
        """Blocks in the file (llama.cpp's block_count): the trunk and the NextN blocks."""
        return self.n_layer + self.n_nextn


def read_model_info(path: Path) -> ModelInfo:
    gguf = GGUFFile(path)
    try:
        arch = gguf.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelError(f"{path}: GGUF has no general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelError(f"{path}: {unsupported_message(arch)}")
        n_block = gguf.get(f"{arch}.block_count")
        n_embd = gguf.get(f"{arch}.embedding_length")
        if not isinstance(n_block, int) or not isinstance(n_embd, int):
            raise ModelError(f"{path}: missing {arch}.block_count or {arch}.embedding_length")
        n_nextn = gguf.get(f"{arch}.nextn_predict_layers") or 0
        if not isinstance(n_nextn, int) or not 0 <= n_nextn < n_block:
            raise ModelError(f"{path}: {arch}.nextn_predict_layers {n_nextn!r} must be in [0, block_count {n_block})")
        n_layer = n_block - n_nextn
        return ModelInfo(path=path, architecture=arch, n_layer=n_layer, n_embd=n_embd,
                         required_layers=required_layers(gguf, arch, n_layer), n_nextn=n_nextn)
    finally:
        gguf.close()


def check_range(info: ModelInfo, layer_start: int, layer_end: int) -> None:
    if not 0 <= layer_start < layer_end <= info.n_layer:
        raise ModelError(
            f"layer range [{layer_start}, {layer_end}) is outside {info.path.name}, "
            f"which has {info.n_layer} layers (valid: 0 <= layer_start < layer_end <= {info.n_layer})"
        )
    problem = split_point_problem(info.architecture, layer_start)
    lacking = missing_kind(info.required_layers, layer_start, layer_end) if layer_end == info.n_layer else ""
    if not problem and lacking:
        layers = info.required_layers[lacking]
        problem = (f"a final {info.architecture} stage needs a {lacking} layer ({', '.join(map(str, layers))}), "
                   f"layers [{layer_start}, {layer_end}) have none: start the final stage at layer {layers[-1]} "
                   f"or earlier (llama.cpp cannot run a slice without one)")
    if problem:
        raise ModelError(f"{info.path.name}: {problem}")


def file_digest(path: Path) -> str:
    """sha256 of the model file, memoised next to the slice cache by (path, size, mtime)."""
    stat = path.stat()
    memo = slice_cache_dir() / "digests.json"
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return str(known[key])
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    known[key] = digest.hexdigest()
    _atomic_write_text(memo, json.dumps(known, indent=1, sort_keys=True))
    return known[key]


def slice_cache_dir() -> Path:
    root = os.environ.get("SKIPPY_CACHE_DIR") or Path.home() / ".cache" / "skippy"
    path = Path(root) / "slices"
    path.mkdir(parents=True, exist_ok=True)
    return path


SKELETON_SUFFIX = ".skeleton.gguf"  # a skeleton and its slices (a calibration's) are named so, beside the slices


def slice_path(digest: str, layer_start: int, layer_end: int, final: bool, skeleton: bool = False) -> Path:
    tail = "final" if final else "stop"
    suffix = SKELETON_SUFFIX if skeleton else ".lean.gguf"
    return slice_cache_dir() / f"{digest[:16]}-{layer_start}-{layer_end}-{tail}{suffix}"


def _slice_metadata(gguf: GGUFFile, info: ModelInfo, layers: list[int], extra: list[bytes]) -> list[bytes]:
    """Metadata entries of the slice: copied raw, except block_count, per-layer arrays and the SWA pattern."""
    arch = info.architecture
    swa = swa_pattern(gguf, arch, info.n_block)
    slice_swa = None if swa is None else [swa[il] for il in layers]
    skip = {f"{arch}.block_count", f"{arch}.attention.sliding_window_pattern"}
    if not any(il >= info.n_layer for il in layers):  # a non-final slice: no NextN block
        skip.add(f"{arch}.nextn_predict_layers")
    if layers[0] > 0:  # token-embedding scales: a later stage's input is a hidden state, not tokens
        skip |= {f"{arch}.{key}" for key in FAMILIES[arch].token_input_keys}
    if slice_swa is not None and not any(slice_swa):
        # Only global layers here: llama.cpp rejects an SWA model without SWA layers, so drop the window.
        skip.add(f"{arch}.attention.sliding_window")
        slice_swa = None
    entries = []
    for key in gguf.kv:
        if key in skip or key.startswith("skippy.slice."):
            continue
        elem = gguf.array_type(key)
        if elem is not None and key.startswith(f"{arch}.") and elem in (BOOL, UINT32, 5, 6):
            values = gguf.get(key)
            if isinstance(values, list) and len(values) == info.n_block:
                # per-layer metadata follows the original layer indices
                entries.append(pack_entry(key, ARRAY, [values[il] for il in layers], elem))
                continue
        entries.append(gguf.raw_entry(key))
    entries.append(pack_entry(f"{arch}.block_count", UINT32, len(layers)))
    if slice_swa is not None:
        entries.append(pack_entry(f"{arch}.attention.sliding_window_pattern", ARRAY, slice_swa, BOOL))
    return entries + extra


EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"


def unused_tensors(names: set[str], info: ModelInfo, layer_start: int, final: bool) -> set[str]:
    """The non-block tensors of `names` that the slice's stage never reads (written as zeros)."""
    unused = set()
    if not final and OUTPUT in names:
        unused.add(OUTPUT)
    if layer_start > 0 and (not final or (OUTPUT in names and info.n_nextn == 0)):
        unused.add(EMBEDDING)
    return unused & names


def write_slice(
    source: Path,
    dest: Path,
    layer_start: int,
    layer_end: int,
    *,
    final: bool,
    digest: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write the slice GGUF for `[layer_start, layer_end)` to `dest` atomically."""
    info = read_model_info(source)
    check_range(info, layer_start, layer_end)
    digest = digest or file_digest(source)
    tail = list(range(info.n_layer, info.n_block)) if final else [
        stop_block(info.required_layers, layer_start, layer_end)]  # the NextN blocks, or the stop block
    layers = list(range(layer_start, layer_end)) + tail
    gguf = GGUFFile(source)
    by_block: dict[int, list[tuple[str, TensorInfo]]] = {}
    plan: list[tuple[str, TensorInfo, memoryview | None]] = []  # (new name, info, bytes or None: zeros): non-block
    # tensors first, then owned blocks renumbered
    zeroed = ({t.name for t in gguf.tensors} if is_skeleton(gguf)
              else unused_tensors({t.name for t in gguf.tensors}, info, layer_start, final))
    for t in gguf.tensors:
        m = _BLOCK.match(t.name)
        if m:
            by_block.setdefault(int(m.group(1)), []).append((m.group(2), t))
        else:
            plan.append((t.name, t, None if t.name in zeroed else gguf.tensor_bytes(t)))
    for new_index, il in enumerate(layers):
        plan.extend((f"blk.{new_index}.{suffix}", t, None if t.name in zeroed else gguf.tensor_bytes(t))
                    for suffix, t in by_block.get(il, []))
    identity = [
        pack_entry("skippy.slice.layer_start", UINT32, layer_start),
        pack_entry("skippy.slice.layer_end", UINT32, layer_end),
        pack_entry("skippy.slice.stop_block", BOOL, not final),
        pack_entry("skippy.slice.source_digest", STRING, digest),
        pack_entry("skippy.slice.source_n_layer", UINT32, info.n_layer),
        pack_entry("skippy.slice.zeroed", STRING, ",".join(sorted(zeroed))),
    ]
    try:
        _write_atomically(dest, _slice_metadata(gguf, info, layers, identity), plan, gguf.alignment, progress)
    finally:
        del plan  # its views into the source's map, before the map closes
        gguf.close()
    return dest


def _write_atomically(dest: Path, entries: list[bytes], plan: list[tuple[str, TensorInfo, memoryview | None]],
                      alignment: int, progress: Progress | None = None) -> None:
    """write_gguf into a temporary file beside `dest`, then renamed over it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name, suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            write_gguf(out, entries, plan, alignment, progress)
        os.replace(tmp_name, dest)
    finally:
        Path(tmp_name).unlink(missing_ok=True)


SKELETON_KEY = "skippy.skeleton"


def is_skeleton(gguf: GGUFFile) -> bool:
    return bool(gguf.get(SKELETON_KEY))


def write_skeleton(source: Path, dest: Path, digest: str | None = None) -> Path:
    """The model's *skeleton*: all its metadata and tensors, every tensor zeros (a sparse file of the header's size
    on disk). It computes as fast as the model (llama.cpp's CPU kernels do not look at values), so a host can time
    the model without being sent it (skippy.remote.host_costs); its slices are skeletons too."""
    gguf = GGUFFile(source)
    entries = [gguf.raw_entry(key) for key in gguf.kv if key != SKELETON_KEY]
    entries.append(pack_entry(SKELETON_KEY, STRING, digest or file_digest(source)))
    try:
        _write_atomically(dest, entries, [(t.name, t, None) for t in gguf.tensors], gguf.alignment)
    finally:
        gguf.close()
    return dest


def ensure_skeleton(source: Path) -> Path:
    """The cached skeleton of this model (written on first use)."""
    digest = file_digest(source)
    dest = slice_cache_dir() / f"{digest[:16]}{SKELETON_SUFFIX}"
    return dest if dest.is_file() else write_skeleton(source, dest, digest)


def stderr_progress(label: str) -> Progress:
    """A progress callback printing `label: NN%` on stderr at most every 10%."""
    shown = [-1]

    def report(done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        if pct // 10 != shown[0] // 10 or done == total:
            shown[0] = pct
            print(f"\r{label}: {pct:3d}% ({done >> 20} / {total >> 20} MiB)", end="", file=sys.stderr)
            if done == total:
                print(file=sys.stderr)

    return report


def ensure_slice(
    source: Path, layer_start: int, layer_end: int, *, final: bool, progress: Progress | None = None
) -> Path:
    """The cached slice for this model digest and range, written on first use."""
    digest = file_digest(source)
    dest = slice_path(digest, layer_start, layer_end, final, skeleton=source.name.endswith(SKELETON_SUFFIX))
    if not dest.is_file():
        write_slice(source, dest, layer_start, layer_end, final=final, digest=digest, progress=progress)
    return dest


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
