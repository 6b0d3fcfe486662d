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

from .errors import InputError, MissingFile

__all__ = [
    "MiB",
    "add_read",
    "check_output",
    "check_regular",
    "is_null_device",
    "note_imported",
    "note_read",
    "open_regular",
    "read_bytes",
    "read_so_far",
    "read_text",
    "replace_with",
    "start_run",
    "write_new",
]

MiB = 1 << 20

# Every file this run read or depends on, by identity (device, inode), with its path and what it is to the run: the
# report may go over none of them, whatever path, hard link or symlink names it, and the refusal says whose file it
# is (an external data file names its model). The CLI clears it at the start of each run.
_inputs: dict[tuple[int, int], tuple[str, str | None]] = {}


def start_run() -> None:
    _inputs.clear()


def read_so_far() -> list[tuple[tuple[int, int], tuple[str, str | None]]]:
    """The files recorded so far, to carry from a worker process to the one that writes the report."""
    return list(_inputs.items())


def add_read(entries: list[tuple[tuple[int, int], tuple[str, str | None]]]) -> None:
    _inputs.update(entries)


def note_read(path: str | os.PathLike, role: str | None = None) -> None:
    """Record a file the run reads (or whose loss would lose the user's data, as a model's weights); role says what
    it is to the run when its name does not ("external data of model.onnx", "a --rules file")."""
    try:
        st = os.stat(path)
    except OSError:
        return
    _inputs.setdefault((st.st_dev, st.st_ino), (str(path), role))


def note_imported() -> None:
    """Record the file of every module imported so far: a factory's model.py and whatever it imported are inputs."""
    import sys

    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            note_read(file)


def write_new(path: str | os.PathLike, text: str, may_replace: tuple[str | os.PathLike, ...] = (),
              what: str = "the report") -> None:
    """Write an output file, refusing one that is (by identity, not by name) a file this run reads; the folders
    missing on its way are made, and os.devnull takes the text with nothing written anywhere.

    Written to a temporary file in the target's folder and renamed into place after the checks, so a reader of the
    old file (or a hard link to it) never sees half a report.
    """
    shown = str(path)
    target = check_output(path, may_replace, what, create=True, null_ok=True)
    if is_null_device(target):
        return
    data = text.encode("utf-8", "surrogateescape")
    try:
        replace_with(target, data, may_replace, what, shown)
    except OSError as exc:
        raise InputError(shown, f"cannot write it: {exc.strerror or exc}") from None


def check_output(path: str | os.PathLike, may_replace: tuple[str | os.PathLike, ...] = (),
                 what: str = "the report", create: bool = False, null_ok: bool = False) -> Path:
    """The file an output path really names, or one InputError: its folder as the operating system resolves it,
    the name in it no symlink and nothing but a regular file, and the file none the run reads (by device and
    inode, hard links included) unless may_replace names it.

    Folders missing on the way are made when create (at the write; checked only, before it), below the nearest
    folder that exists; a '..' after a missing folder is refused, since x/../model.onnx through a missing x would
    land on model.onnx once x is made. null_ok: os.devnull (the device itself, not a link to it) is an output the
    caller writes nothing to."""
    shown = str(path)
    folder, name = os.path.split(os.fspath(path))
    if name in ("", ".", ".."):
        raise InputError(shown, "names a folder, not a file")
    real_folder = _output_folder(folder or ".", shown, create)
    target = real_folder / name
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise InputError(shown, f"cannot write it: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(shown, "is a symlink: precaudit writes no output through one (it could point at an input)")
    if null_ok and _is_null(st):
        return target
    if not stat.S_ISREG(st.st_mode):
        raise InputError(shown, f"is {_kind(st.st_mode)}: precaudit writes outputs over regular files only")
    key = (st.st_dev, st.st_ino)
    allowed = {_identity(p) for p in may_replace} - {None}
    if key in _inputs and key not in allowed:
        read_as, role = _inputs[key]
        said = [p for p in (None if read_as == shown else read_as, role) if p]
        named = f" ({': '.join(said)})" if said else ""
        raise InputError(shown, f"refusing to write {what} over one of the inputs{named}")
    return target


def _output_folder(folder: str, shown: str, create: bool) -> Path:
    """The output's folder resolved as the OS resolves it: the nearest folder of it that exists, then the missing
    ones under it (made when create)."""
    missing: list[str] = []
    head = folder
    while not os.path.lexists(head):
        head, part = os.path.split(head)
        if part == "..":
            raise InputError(shown, "its folder does not exist, and a '..' after a missing folder is refused (it "
                                    "would resolve elsewhere once the folder is made)")
        if part not in ("", "."):
            missing.insert(0, part)
        if not head:
            head = "."
            break
    try:
        real = os.path.realpath(head, strict=True)
        if not os.path.isdir(real):
            raise NotADirectoryError
    except (OSError, NotADirectoryError):
        raise InputError(shown, "its folder does not exist") from None
    if missing and create:
        try:
            os.makedirs(os.path.join(real, *missing), exist_ok=True)
        except OSError as exc:
            raise InputError(shown, f"cannot make its folder: {exc.strerror or exc}") from None
        return _output_folder(folder, shown, create=False)  # resolved again, as made
    return Path(real, *missing)


def is_null_device(path: str | os.PathLike) -> bool:
    """Whether the path names os.devnull itself (the null device, not a symlink to it)."""
    try:
        return _is_null(os.lstat(path))
    except OSError:
        return False


def _is_null(st: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (st.st_dev, st.st_ino, st.st_rdev) == (null.st_dev, null.st_ino, null.st_rdev)


def replace_with(target: Path, data: bytes | None, may_replace: tuple[str | os.PathLike, ...] = (),
                 what: str = "the report", shown: str | None = None, written: Path | None = None) -> None:
    """Put data (or the file `written`, already in target's folder) at target: a temporary file in that folder,
    the target checked again just before the rename (it may have changed since), then the rename."""
    tmp = written if written is not None else target.with_name(f".{target.name}.precaudit-{os.getpid()}.tmp")
    try:
        if written is None:
            with open(tmp, "xb") as fh:
                fh.write(data or b"")
        if check_output(target, may_replace, what) != target:
            raise InputError(shown or str(target), "changed while precaudit wrote it")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
        raise MissingFile(shown, "no such file") from None
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
        raise MissingFile(shown, "no such file") from None
    except IsADirectoryError:
        raise InputError(shown, "is a directory, not a regular file") from None
    except OSError as exc:
        raise InputError(shown, f"cannot open it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            raise InputError(shown, f"is {_kind(mode)}, not a regular file; precaudit reads only regular files")
        _inputs.setdefault((st.st_dev, st.st_ino), (str(path), None))
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
