"""Read an .npz of input arrays from a stranger: no pickles, no zip bombs, no header that asks for a terabyte.

numpy.load trusts the archive: a member that is not .npy comes back as bytes, an .npy header may declare 2^40
floats, and a 2 MB member may inflate to 2 GB. Here every member must be an .npy whose header, checked before any
data is inflated, declares a plain dtype and exactly as many bytes as the zip directory says the member holds, and
the archive's arrays together stay under a stated bound.
"""

from __future__ import annotations

import math
import zipfile

import numpy as np

from ..errors import InputError
from ..files import open_regular

__all__ = ["MAX_NPZ_BYTES", "MAX_NPZ_MEMBERS", "read_npz"]

MAX_NPZ_BYTES = 1 << 30  # 1 GiB of arrays per file: a batch of inputs, not a data set
MAX_NPZ_MEMBERS = 1024
_MAX_HEADER = 1 << 16


def read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz (numpy.savez / savez_compressed), by name without the .npy suffix."""
    with open_regular(path) as fh:
        try:
            with zipfile.ZipFile(fh) as archive:
                members = archive.infolist()
                _check_directory(members, path)
                return {m.filename[:-4]: _read_member(archive, m, path) for m in members}
        except InputError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
            raise InputError(path, f"not a readable .npz file ({type(exc).__name__}: {_first_line(exc)})") from None


def _check_directory(members: list[zipfile.ZipInfo], path: str) -> None:
    if len(members) > MAX_NPZ_MEMBERS:
        raise InputError(path, f"holds {len(members)} members; an inputs file holds one array per graph input")
    total = 0
    for m in members:
        if not m.filename.endswith(".npy"):
            raise InputError(path, f"member {m.filename[:80]!r} is not an .npy array; save inputs with "
                                   "numpy.savez(path, name=array, ...)")
        total += m.file_size
        if total > MAX_NPZ_BYTES:
            raise InputError(path, f"its arrays unpack to more than {MAX_NPZ_BYTES >> 20} MiB; precaudit reads "
                                   "at most that from one inputs file")


def _read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, path: str) -> np.ndarray:
    name = member.filename[:-4]
    with archive.open(member) as stream:
        try:
            version = np.lib.format.read_magic(stream)
            reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in reader:
                raise ValueError(f"npy format version {version}")
            shape, fortran, dtype = reader[version](stream, max_header_size=_MAX_HEADER)
        except ValueError as exc:
            raise InputError(path, f"array '{name}' has no valid .npy header ({_first_line(exc)})") from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise InputError(path, f"array '{name}' holds Python objects ({dtype}); only numeric arrays are read")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != member.file_size - stream.tell():
            raise InputError(path, f"array '{name}': its header declares {nbytes} bytes of {dtype} {list(shape)}, "
                                   f"the member holds {member.file_size - stream.tell()}")
        data = stream.read(nbytes)
    if len(data) != nbytes:
        raise InputError(path, f"array '{name}' is truncated")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
