"""A minimal GGUF (v2/v3) reader and re-writer that copies bytes instead of decoding them.

`gguf.GGUFReader` builds a numpy view for every element of every metadata array, which is slow for a
large vocabulary such as Gemma's 262k tokens (measured: docs/measurements.md, 'GGUF metadata reading');
a slice only needs a few keys decoded and everything else copied.
Here metadata values are kept as raw byte spans, decoded on request, and tensor data is streamed.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from skippy.runtime.errors import ModelError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type -> struct format of a scalar (STRING=8 and ARRAY=9 are variable-length)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY, BOOL, UINT32 = 8, 9, 7, 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        n = 1
        for d in self.dims:
            n *= d
        return n * size // block


class GGUFFile:
    """Parsed header of a GGUF file: raw metadata spans and tensor infos (data stays on disk)."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ModelError(f"model file not found: {path}")
        self.path = path
        try:
            with path.open("rb") as f:
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse()
        except ModelError:
            raise
        except (ValueError, struct.error, IndexError, KeyError, UnicodeDecodeError, OSError) as exc:
            raise ModelError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    # -- parsing ---------------------------------------------------------------------------------
    def _read(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self._buf, self._pos)
        self._pos += struct.calcsize("<" + fmt)
        return values

    def _read_str(self) -> str:
        (n,) = self._read("Q")
        if n > len(self._buf) - self._pos:
            raise ValueError(f"string length {n} runs past the end of the file")
        s = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _skip_value(self, vtype: int) -> None:
        if vtype == STRING:
            (n,) = self._read("Q")
            self._pos += n
        elif vtype == ARRAY:
            etype, count = self._read("IQ")
            if etype in _SCALAR:
                self._pos += struct.calcsize(_SCALAR[etype]) * count
            else:
                for _ in range(count):
                    self._skip_value(etype)
        elif vtype in _SCALAR:
            self._pos += struct.calcsize(_SCALAR[vtype])
        else:
            raise ValueError(f"unknown metadata value type {vtype}")

    def _parse(self) -> None:
        self._pos = 0
        if bytes(self._buf[:4]) != GGUF_MAGIC:
            raise ValueError("bad magic (not a GGUF file)")
        self._pos = 4
        self.version, n_tensors, n_kv = self._read("IQQ")
        if self.version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {self.version}")
        self.kv: dict[str, tuple[int, int, int]] = {}  # key -> (vtype, value start, value end)
        self.kv_spans: dict[str, tuple[int, int]] = {}  # key -> (entry start, entry end)
        for _ in range(n_kv):
            entry_start = self._pos
            key = self._read_str()
            (vtype,) = self._read("I")
            start = self._pos
            self._skip_value(vtype)
            self.kv[key] = (vtype, start, self._pos)
            self.kv_spans[key] = (entry_start, self._pos)
        self.tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = self._read_str()
            (n_dims,) = self._read("I")
            dims = self._read("Q" * n_dims)
            ggml_type, offset = self._read("IQ")
            self.tensors.append(TensorInfo(name, tuple(dims), ggml_type, offset))
        self.alignment = int(self.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
        self.data_start = _align(self._pos, self.alignment)
        end = max((self.data_start + t.offset + t.nbytes for t in self.tensors), default=self.data_start)
        if end > len(self._buf):
            raise ValueError(f"tensor data runs past the end of the file ({end} > {len(self._buf)} bytes)")

    # -- access ----------------------------------------------------------------------------------
    def get(self, key: str, default: object = None) -> object:
        """Decode one metadata value (strings, scalars, arrays of scalars or strings)."""
        if key not in self.kv:
            return default
        vtype, start, _ = self.kv[key]
        self._pos = start
        return self._decode(vtype)

    def _decode(self, vtype: int) -> object:
        if vtype == STRING:
            return self._read_str()
        if vtype == ARRAY:
            etype, count = self._read("IQ")
            return [self._decode(etype) for _ in range(count)]
        return self._read(_SCALAR[vtype])[0]

    def array_type(self, key: str) -> int | None:
        """Element type of an array value (None for non-arrays)."""
        vtype, start, _ = self.kv[key]
        return struct.unpack_from("<I", self._buf, start)[0] if vtype == ARRAY else None

    def raw_entry(self, key: str) -> bytes:
        start, end = self.kv_spans[key]
        return bytes(self._buf[start:end])

    def tensor_bytes(self, tensor: TensorInfo) -> memoryview:
        start = self.data_start + tensor.offset
        return memoryview(self._buf)[start : start + tensor.nbytes]

    def close(self) -> None:
        self._buf.close()


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def pack_str(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def pack_entry(key: str, vtype: int, value: object, elem_type: int | None = None) -> bytes:
    """Encode one metadata entry (scalars, strings, or an array of scalars)."""
    head = pack_str(key) + struct.pack("<I", vtype)
    if vtype == STRING:
        return head + pack_str(str(value))
    if vtype == ARRAY:
        assert elem_type in _SCALAR and isinstance(value, list)
        return head + struct.pack(f"<IQ{len(value)}{_SCALAR[elem_type]}", elem_type, len(value), *value)
    return head + struct.pack("<" + _SCALAR[vtype], value)


def write_gguf(
    out: BinaryIO,
    entries: list[bytes],
    tensors: list[tuple[str, TensorInfo, memoryview | None]],
    alignment: int,
    progress: object = None,
) -> None:
    """Write a GGUF v3 file: encoded metadata entries, then (new name, info, bytes) tensors in order. A tensor whose
    bytes are None is all zeros, left as a hole (`out` is seekable; on most filesystems the file is then sparse)."""
    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", 3, len(tensors), len(entries)))
    for entry in entries:
        header += entry
    offset = 0
    for name, info, _ in tensors:
        header += pack_str(name) + struct.pack(f"<I{len(info.dims)}QIQ", len(info.dims), *info.dims, info.ggml_type, offset)
        offset = _align(offset + info.nbytes, alignment)
    header += b"\0" * (_align(len(header), alignment) - len(header))
    out.write(header)
    total = sum(info.nbytes for _, info, _ in tensors)
    done = 0
    for _, info, data in tensors:
        if data is None:
            out.seek(_align(info.nbytes, alignment), os.SEEK_CUR)
        else:
            out.write(data)
            out.write(b"\0" * (_align(len(data), alignment) - len(data)))
        done += info.nbytes
        if callable(progress):
            progress(done, total)
    out.truncate()
