"""precaudit: a precision audit for ML models in fp16, bf16 and fp8.

    import precaudit
    report = precaudit.audit("model.onnx", dtype="fp16")
    report.ok, report.findings, report.to_text()

The names below load on first use: `precaudit --version` and `import precaudit` stay instant.
"""

from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = ["InputError", "Report", "__version__", "audit", "fix", "keep_list", "train_audit"]


def __getattr__(name: str) -> Any:
    if name in ("audit", "keep_list", "fix", "train_audit", "Report"):
        from . import api
        return getattr(api, name)
    if name == "InputError":
        from .errors import InputError
        return InputError
    raise AttributeError(f"module 'precaudit' has no attribute {name!r}")
