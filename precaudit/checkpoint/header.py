"""A safetensors file's header: the 8-byte little-endian length, the JSON after it, and every claim in it checked
against the file before one byte of tensor data is read.

A stranger's file may claim a header longer than the file, tensors past its end or on top of each other, a dtype
no reader knows, or one tensor name twice. The last is the quiet one: the `safetensors` library (0.8) keeps the
second entry and says nothing, so a NaN scale under the first name never shows. Here each is one InputError naming
the file and the problem, raised before any tensor byte is read: nothing beyond what the header proves is there.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..files import open_regular

__all__ = ["BITS", "MAX_HEADER", "Shard", "TensorInfo", "load_json", "read_header"]

MAX_HEADER = 100_000_000  # safetensors' own limit on the header (its Rust reader refuses a longer one)

# Every dtype string of the safetensors format (0.8), with its width in bits.
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
        "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it; start and stop are absolute byte offsets in its file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int
    file: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


@dataclass
class Shard:
    """One .safetensors file: its size, how many bytes its header takes (8 + the JSON), its tensors, metadata."""

    path: str
    size: int
    header_bytes: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]


class _Duplicate(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # rare: only then find which key came twice
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(path: str, data: bytes, what: str) -> Any:
    """The JSON in data, or one InputError: not UTF-8, not JSON, a key twice in one object, NaN/Infinity."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"{what} is not UTF-8 (byte 0x{data[exc.start]:02x} at {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Duplicate as dup:
        kind = "the key" if dup.key in ("dtype", "shape", "data_offsets") else "the name"
        raise InputError(path, f"{what} gives {kind} {dup.key!r} twice (a reader keeps one of them silently)") \
            from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"{what} is not valid JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise InputError(path, f"{what} is JSON nested too deeply to read") from None
    except ValueError as exc:  # NaN/Infinity, or an integer with more digits than Python converts
        raise InputError(path, f"{what} is not valid JSON: {exc}") from None


def read_header(path: str) -> Shard:
    """The file's header, checked: refused (InputError) before any tensor byte is read if any claim is false."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) < 8:
            raise InputError(path, f"truncated header: the file has {size} bytes, and a safetensors file starts with "
                                   "an 8-byte header length")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER:
            raise InputError(path, f"header length {length:,} bytes is over the {MAX_HEADER:,}-byte limit "
                                   "safetensors itself sets")
        if 8 + length > size:
            raise InputError(path, f"header length {length:,} bytes runs past the end of the file ({size:,} bytes)")
        data = fh.read(length)
    if len(data) < length:  # the file shrank since fstat
        raise InputError(path, "truncated header: the file ended while its header was read")
    entries = load_json(path, data, "the header")
    if not isinstance(entries, dict):
        raise InputError(path, "the header is not a JSON object of tensors")
    metadata = _metadata(path, entries.pop("__metadata__", {}))
    tensors = {name: _tensor(path, name, entry, 8 + length) for name, entry in entries.items()}
    _check_extents(path, list(tensors.values()), 8 + length, size)
    return Shard(path, size, 8 + length, tensors, metadata)


def _metadata(path: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InputError(path, "the header's __metadata__ is not an object of strings")
    return value


def _naturals(values: Any) -> list[int] | None:
    """The list, if it is a list of integers >= 0 (no bool: JSON true is no dimension)."""
    ok = type(values) is list and all(type(v) is int and v >= 0 for v in values)
    return values if ok else None


def _tensor(path: str, name: str, entry: Any, data_start: int) -> TensorInfo:
    """One header entry as a TensorInfo: a known dtype, a shape and offsets that agree on its size."""
    if not isinstance(entry, dict):
        raise InputError(path, f"tensor {name!r}: its header entry is not an object")
    dtype = entry.get("dtype")
    shape, offsets = _naturals(entry.get("shape")), _naturals(entry.get("data_offsets"))
    if not isinstance(dtype, str) or dtype not in BITS:
        raise InputError(path, f"tensor {name!r} has the unknown dtype {dtype!r} (safetensors knows "
                               f"{', '.join(BITS)})")
    if shape is None:
        raise InputError(path, f"tensor {name!r}: shape {entry.get('shape')!r} is not a list of non-negative "
                               "integers")
    if offsets is None or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise InputError(path, f"tensor {name!r}: data_offsets {entry.get('data_offsets')!r} are not [begin, end] "
                               "with 0 <= begin <= end")
    bits = math.prod(shape) * BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise InputError(path, f"tensor {name!r}: shape {shape} of {dtype} is {bits / 8:,g} bytes, but its "
                               f"data_offsets {offsets} span {offsets[1] - offsets[0]:,}")
    return TensorInfo(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1], path)


def _check_extents(path: str, tensors: list[TensorInfo], data_start: int, size: int) -> None:
    """Every tensor inside the file's data, and no two sharing a byte."""
    end = size - data_start
    previous: TensorInfo | None = None
    for t in sorted((t for t in tensors if t.nbytes), key=lambda t: (t.start, t.stop)):
        if t.stop > size:
            raise InputError(path, f"tensor {t.name!r}: data_offsets [{t.start - data_start:,}, "
                                   f"{t.stop - data_start:,}] run past the end of the data ({end:,} bytes after "
                                   "the header)")
        if previous is not None and t.start < previous.stop:
            raise InputError(path, f"tensors {previous.name!r} and {t.name!r} overlap: data bytes "
                                   f"[{previous.start - data_start:,}, {previous.stop - data_start:,}) and "
                                   f"[{t.start - data_start:,}, {t.stop - data_start:,})")
        previous = t
