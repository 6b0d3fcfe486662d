"""Run the CLI in-process and read its JSON report, as a user's script would."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from precaudit.cli import main

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "precaudit/schemas/report.schema.json").read_text())


def run_json(models: list[Path | str], *args: str, out_dir: Path) -> tuple[int, dict]:
    """Exit code and parsed JSON report of `precaudit MODELS... ARGS -f json -o FILE`."""
    out = out_dir / "report.json"
    code = main([*map(str, models), *args, "--format", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(report)  # every report any test reads follows the schema
    return code, report


def assert_traced_alike(model: Path | str, out_dir: Path) -> list[tuple[str, str]]:
    """Trace the model on both engines: no errors, every node on onnxruntime, the same PA9 findings (returned)."""
    found = {}
    for engine in ("onnxruntime", "numpy"):
        _, report = run_json([model], "--trace", "--trace-engine", engine, "--select", "PA9", out_dir=out_dir)
        assert report["errors"] == []
        found[engine] = sorted((r["rule_id"], r["node_name"]) for r in report["results"])
        if engine == "onnxruntime":
            assert report["trace"][0]["nodes"]["numpy"] == 0
    assert found["onnxruntime"] == found["numpy"]
    return found["onnxruntime"]


_BOUNDED = """
import sys
from precaudit.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as fh:
    # VmHWM is this process's own peak; ru_maxrss would include the forked parent's memory from before exec
    fh.write(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
sys.exit(code)
"""


def run_cli_process(args: list[str], tmp_path: Path, timeout: float = 120, **popen) -> tuple[int, str, str, float]:
    """Run precaudit in a child process: exit code, stdout, stderr and the child's peak RSS in MB.

    A child catches what an in-process run cannot: a hang (the timeout fails the test), memory (its own peak), a
    write to a real file descriptor, an exit from deep inside a library.
    """
    import subprocess
    import sys

    rss_file = tmp_path / "peak_rss.txt"
    rss_file.unlink(missing_ok=True)
    popen.setdefault("stdout", subprocess.PIPE)
    proc = subprocess.run([sys.executable, "-c", _BOUNDED, str(rss_file), *map(str, args)], stderr=subprocess.PIPE,
                          text=True, timeout=timeout, cwd=Path(__file__).resolve().parent.parent, **popen)
    peak = int(rss_file.read_text()) / 1024 if rss_file.exists() else float("nan")
    return proc.returncode, proc.stdout or "", proc.stderr, peak
