"""Tensor data in an ONNX file (inline or external), read only when asked and never more than its dims say.

A model from a pull request may declare dims whose product wraps a 64-bit count, an external `length` of 2^62, an
`offset` of -4 or "abc", a data file that is a link to /dev/zero, or bytes that disagree with the dims. Sizes are
computed with Python integers (no wrap-around), every external read is exactly dims × itemsize bytes from a regular
file inside the model's folder, and any mismatch is one InputError naming the model and the tensor.

External tensors of MAP_BYTES or more are memory-mapped, read-only, not copied: the array's pages are the file's, read
from disk when touched and given back when the array is dropped, so a traced run of a 13 GB model holds only the
weights it is using. A mapping covers exactly the tensor's bytes (from the page boundary below its offset), checked
against the file's size on the descriptor it maps, so it never extends past the end of the file.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import InputError
from ..files import note_read, open_regular

__all__ = ["MAP_BYTES", "element_count", "tensor_loader", "text"]

_T = onnx.TensorProto
# Types stored several to a byte: bits per element.
_PACKED_BITS: dict[int, int] = {_T.INT4: 4, _T.UINT4: 4, _T.FLOAT4E2M1: 4}
for _name, _bits in (("INT2", 2), ("UINT2", 2)):
    if hasattr(_T, _name):
        _PACKED_BITS[getattr(_T, _name)] = _bits


def element_count(dims, path: str, what: str) -> int:
    """The number of elements the dims declare, exactly (no 64-bit wrap); a negative dim is an error."""
    if dims and min(dims) < 0:
        raise InputError(path, f"{what} has a negative dim {[int(d) for d in dims]}")
    return math.prod(dims)


def tensor_loader(tensor: onnx.TensorProto, path: str, model_dir: Path, what: str,
                  noted: set | None = None, count: int | None = None) -> Callable[[], np.ndarray]:
    """A function that returns the tensor's data, read only when it is called.

    What can be checked without reading the data is checked now, so a static audit refuses a broken model too:
    dims against the inline bytes, an external entry's path, offset and length. A missing external file is not
    an error until its data is needed: a static audit of a model whose weights were never downloaded still works.
    noted: data files already recorded as read during this load (a model's thousands of tensors name a few files).
    count: element_count(tensor.dims), when the caller has checked it already.
    """
    if tensor.data_location == _T.EXTERNAL:
        target, *_ = _external_entry(tensor, path, model_dir, what, count)
        if noted is None or target not in noted:
            # weights a static audit never reads are still the user's: never write over them
            note_read(target, f"external data of {path}")
            if noted is not None:
                noted.add(target)
        return lambda: _external(tensor, path, model_dir, what)
    if count is None:
        count = element_count(tensor.dims, path, what)
    raw = tensor.raw_data  # (a copy: read once)
    if raw and tensor.data_type not in (_T.STRING, _T.UNDEFINED):
        _check_raw(tensor, len(raw), _byte_count(tensor, count, path, what), path, what)
    return lambda: _to_array(tensor, path, what)


def _check_raw(tensor: onnx.TensorProto, held: int, expected: int, path: str, what: str) -> None:
    if held != expected:
        raise InputError(path, f"{what}: dims {list(tensor.dims)} need {expected} bytes of data, "
                               f"the file holds {held}")


def _to_array(tensor: onnx.TensorProto, path: str, what: str) -> np.ndarray:
    count = element_count(tensor.dims, path, what)
    raw = tensor.raw_data
    if raw and tensor.data_type not in (_T.STRING, _T.UNDEFINED):
        _check_raw(tensor, len(raw), _byte_count(tensor, count, path, what), path, what)
        dtype = _plain_dtype(tensor.data_type)
        if dtype is not None and not tensor.HasField("segment"):
            # what numpy_helper.to_array does with raw bytes of a type stored one element each, without its lookups
            return np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))
    try:
        return numpy_helper.to_array(tensor)
    except Exception as exc:  # typed fields that disagree with the dims, an unknown data type
        raise InputError(path, f"{what}: its data does not match its dims and type ({_first_line(exc)})") from None


def _byte_count(tensor: onnx.TensorProto, count: int, path: str, what: str) -> int:
    bits = _PACKED_BITS.get(tensor.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    itemsize = _itemsize(tensor.data_type)
    if itemsize is None:
        raise InputError(path, f"{what} has an unknown data type {tensor.data_type}")
    return count * itemsize


@functools.lru_cache(maxsize=64)
def _itemsize(data_type: int) -> int | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except Exception:
        return None


def _external_entry(tensor: onnx.TensorProto, path: str, model_dir: Path, what: str,
                    count: int | None = None) -> tuple[Path, int, int, bool]:
    """The external data file (inside the model's folder), offset, byte count and whether a length is written;
    refused when they disagree."""
    info = {text(e.key): text(e.value) for e in tensor.external_data}
    location = info.get("location", "")
    if not location:
        raise InputError(path, f"{what}: external data entry has no location")
    target = _inside(model_dir, location)
    if target is None:
        raise InputError(path, f"{what}: external data path {location[:200]!r} leaves the model's folder")
    offset = _non_negative(info, "offset", path, what)
    if count is None:
        count = element_count(tensor.dims, path, what)
    expected = _byte_count(tensor, count, path, what)
    if "length" in info and _non_negative(info, "length", path, what) != expected:
        raise InputError(path, f"{what}: external data length {info['length'][:40]} disagrees with dims "
                               f"{list(tensor.dims)} ({expected} bytes)")
    return target, offset, expected, "length" in info


@functools.lru_cache(maxsize=256)
def _inside(model_dir: Path, location: str) -> Path | None:
    """The resolved external data file, if it stays inside the model's folder (symlinks resolved); a model's
    thousands of tensors name a handful of files, so each is resolved once."""
    target = (model_dir / location).resolve()
    return None if os.path.isabs(location) or model_dir not in target.parents else target


# External tensors at least this large are memory-mapped; smaller ones are read (a mapping per eps or bias would
# cost a system call and an address-space entry each, and Linux allows a process about 65,000 of them).
MAP_BYTES = 1 << 20


def _external(tensor: onnx.TensorProto, path: str, model_dir: Path, what: str) -> np.ndarray:
    target, offset, expected, has_length = _external_entry(tensor, path, model_dir, what)
    location = target.name
    dtype = _mappable(tensor)
    with open_regular(target, f"{path}: {what}: external data file {location!r}") as fh:
        size = os.fstat(fh.fileno()).st_size
        if offset + expected > size:
            raise InputError(path, f"{what}: external data file {location!r} holds {size} bytes, fewer than "
                                   f"offset {offset} + {expected} bytes")
        if not has_length and size - offset != expected:
            # no length: the data runs to the end of the file (onnx reads it so), which the dims must then fill;
            # only the bytes the dims need are read, so a scalar eps in front of 3 GiB costs nothing to refuse
            raise InputError(path, f"{what}: external data has no length, so it runs from offset {offset} to the "
                                   f"end of {location!r} ({size - offset} bytes), but dims {list(tensor.dims)} "
                                   f"hold {expected} bytes")
        if dtype is not None and expected >= MAP_BYTES:
            array = _mapped(fh, offset, expected, dtype, tensor.dims)
            if os.fstat(fh.fileno()).st_size < offset + expected:  # it shrank meanwhile: never touch the pages
                raise InputError(path, f"{what}: external data file {location!r} is truncated")
            return array
        fh.seek(offset)
        raw = fh.read(expected)
    if len(raw) != expected:  # the file shrank while being read
        raise InputError(path, f"{what}: external data file {location!r} is truncated")
    if dtype is not None:  # what numpy_helper.to_array makes of raw bytes, without copying them into a TensorProto
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))
    inline = onnx.TensorProto()
    inline.CopyFrom(tensor)
    del inline.external_data[:]
    inline.data_location = _T.DEFAULT
    inline.raw_data = raw
    return _to_array(inline, path, what)


def _mappable(tensor: onnx.TensorProto) -> np.dtype | None:
    """The numpy dtype whose bytes are the tensor's stored bytes, one element each; None for packed types (int4,
    fp4, fp6), strings, unknown types, or a big-endian host (ONNX stores little-endian)."""
    return _plain_dtype(tensor.data_type)


@functools.lru_cache(maxsize=64)
def _plain_dtype(data_type: int) -> np.dtype | None:
    if sys.byteorder != "little" or data_type in _PACKED_BITS or data_type in (_T.STRING, _T.UNDEFINED):
        return None
    if data_type in (getattr(_T, "FLOAT6E2M3", -1), getattr(_T, "FLOAT6E3M2", -1)):
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:
        return None
    return None if dtype.kind in "OSUa" else dtype


def _mapped(fh, offset: int, expected: int, dtype: np.dtype, dims) -> np.ndarray:
    """A read-only array over exactly `expected` bytes at `offset` of the open file (checked to hold them)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page boundary
    # the mapping ends at offset + expected, which the caller checked against the size of this descriptor's file
    view = mmap.mmap(fh.fileno(), offset + expected - start, offset=start, access=mmap.ACCESS_READ)
    if hasattr(view, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        view.madvise(mmap.MADV_SEQUENTIAL)  # read ahead: weights are read front to back
    array = np.frombuffer(view, dtype=dtype, count=expected // dtype.itemsize, offset=offset - start)
    return array.reshape(tuple(int(d) for d in dims))


def _non_negative(info: dict[str, str], key: str, path: str, what: str) -> int:
    text = info.get(key, "0")
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise InputError(path, f"{what}: external data {key} {text[:40]!r} is not a non-negative integer")
    return number


def text(value: str | bytes) -> str:
    """A string field as text. protobuf hands over a field that is not UTF-8 as bytes; such bytes are kept (as
    surrogate escapes, which reports print visibly) rather than crashing whatever reads the name next."""
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
