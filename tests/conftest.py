"""What every test file shares: the tiers, the optional packages a test needs, and the folder a test runs in.

Tiers: `python -m pytest -q` runs the default tier (every rule's fire/quiet fixture, each training rule's first
firing and first quiet case among them, the CLI, the API, the renderers, the runtimes, the hostile-input fuzzing);
`python -m pytest -q -m slow` runs the rest (the PyTorch frontend, autocast and training tests that capture modules
and run real steps, the real exporters on transformers models, the training sweep, every fixture rendered as HTML,
models over 1 GB). CI (.ci/run) runs both. A test joins the slow tier with
`@pytest.mark.slow` (or `pytestmark` for a file) when it takes seconds and covers what a default-tier test already
reaches.

A test that needs an optional package says so with `@pytest.mark.requires("torch", ...)` (or `pytestmark` for a
whole file), and is skipped, naming what is missing, where it is not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each test whose `requires` marker names a package that is not installed."""
    found: dict[str, bool] = {}
    for item in items:
        needed = [m for mark in item.iter_markers("requires") for m in mark.args]
        missing = [m for m in needed if not found.setdefault(m, _installed(m))]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)} (not installed)"))


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty repository folder (it has a .git, so no pyproject above it applies), entered as a user would."""
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path
