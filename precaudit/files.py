"""Reading files a stranger may have made: only regular files, only the bytes asked for, never a hang.

Every file precaudit reads (models, external data, rule files, baselines, input batches, pyproject) may come from
a pull request. A path can be a symlink to /dev/zero (reads forever), a FIFO (open() blocks until a writer comes),
a socket or a directory. Opening with O_NONBLOCK never blocks on a FIFO, and checking the *opened* descriptor with
fstat decides on the file actually read, not on a name that may be swapped between a check and the open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import InputError

__all__ = ["open_regular", "read_bytes", "read_text", "check_regular", "MiB"]

MiB = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular(path: str | os.PathLike, shown: str | None = None) -> Path:
    """The path, if it names (through symlinks) a regular file; else one InputError naming it and what it is."""
    shown = str(path) if shown is None else shown
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(shown, "no such file") from None
    except OSError as exc:
        raise InputError(shown, f"cannot read it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        what = _kind(mode)
        raise InputError(shown, f"is {what}, not a regular file; precaudit reads only regular files")
    return Path(path)


def open_regular(path: str | os.PathLike, shown: str | None = None) -> BinaryIO:
    """Open for binary reading without blocking; refuse anything but a regular file (checked on the descriptor)."""
    shown = str(path) if shown is None else shown
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(shown, "no such file") from None
    except IsADirectoryError:
        raise InputError(shown, "is a directory, not a regular file") from None
    except OSError as exc:
        raise InputError(shown, f"cannot open it: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(shown, f"is {_kind(mode)}, not a regular file; precaudit reads only regular files")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, limit: int, shown: str | None = None, what: str = "file") -> bytes:
    """The whole file, if it is a regular file of at most `limit` bytes (never reads more than limit + 1)."""
    shown = str(path) if shown is None else shown
    with open_regular(path, shown) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(shown, f"{what} is larger than {_size(limit)}; precaudit refuses to read it")
    return data


def read_text(path: str | os.PathLike, limit: int, shown: str | None = None, what: str = "file") -> str:
    """A UTF-8 text file (at most `limit` bytes); a byte that is not UTF-8 is an error naming its line."""
    data = read_bytes(path, limit, shown, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(str(path) if shown is None else shown, f"is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                         line=line) from None


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n} bytes"
