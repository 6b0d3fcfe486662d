"""The one error type users see: a file and what is wrong with it (exit code 2, one line)."""

from __future__ import annotations

from .escape import printable

__all__ = ["InputError", "MissingFile"]


class InputError(Exception):
    """Bad input from the user: an unreadable model, a broken rule file, a bad option value.

    file and problem stay as given (the JSON report carries them raw); str() is the one line users read, with
    everything in it escaped: the problem may quote a name from the model, and the file is a path the user
    typed, which may itself hold a newline.
    """

    def __init__(self, file: str | None, problem: str, line: int | None = None):
        self.file = file
        self.problem = problem
        self.line = line
        super().__init__(str(self))

    def __reduce__(self):  # a worker process (-j) sends its errors back to the parent
        return (type(self), (self.file, self.problem, self.line))

    def __str__(self) -> str:
        where = self.file or ""
        if self.file and self.line:
            where += f":{self.line}"
        return printable(f"{where}: {self.problem}" if where else self.problem)


class MissingFile(InputError):
    """A file the input names that is not there (files.open_regular): a graph fetched without its weights data
    file is still audited where the audit reads no weight, so a reader may skip what it cannot find."""
