"""The version, in a module of its own: the reports, the baseline and the command line import it without importing
the package's API (precaudit/__init__.py loads it on first use)."""

__version__ = "0.1.0"
