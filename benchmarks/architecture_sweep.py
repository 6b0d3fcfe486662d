"""Audit small random-init transformers models of many architectures, as both torch exporters write them.

Not a speed benchmark: a sweep for false findings and crashes on graphs real exporters emit. Each architecture is
built from its config with tiny sizes (random weights), called as users call it, and exported with the TorchScript
exporter (opset 17) and the dynamo exporter, each in its own process; then every export is audited by the
precaudit command line, also in its own process:

  fp16, bf16        the static audit at that --dtype
  trace             --trace --dtype fp16 (synthesized inputs)
  converters        --converter onnxconverter-common, modelopt, onnxruntime (with --converters)
  keep-list         --keep-list: `keep-list --for onnxruntime` run as printed (its snippet converts the model with
                    onnxruntime's converter), the converted model re-audited, and the same converter run with no
                    list: the first must be clean, the second must find what the static audit predicted

It prints a line per export: the rule ids and counts per mode, any error, and a traceback as FAILED. With
--census PAGE it writes the precision census instead (docs/census.md; rendered by benchmarks/census.py): each export
gets one child process that runs every mode through the Python API (fp16, bf16 and fp8-e4m3 static audits, traced
fp16, the three converters, `keep-list --for onnxruntime`, `fix` and the re-audit of what it wrote, and fp16 at
--runtime ort-cpu, ort-cuda, tensorrt, openvino-cpu and coreml: the last on the module itself), a crash or a
timeout is FAILED in that row, and the page is rewritten after each architecture (an interrupted run leaves a page
that says how far it got). --census-check PAGE reruns the architectures PAGE holds and exits 1, printing the rows,
where the data differs (the timing and the commit are not data). With
--dynamic, text models are exported with (input_ids, attention_mask) and dynamic batch and sequence instead. The
exports go in a temporary folder (or --keep DIR). Needs torch, transformers, onnxscript and onnxruntime; the
session that added it ran 47 architectures (docs/analysis.md, "Validation on real exports").

    python benchmarks/architecture_sweep.py [--only LlamaModel,T5EncoderModel] [--dynamic] [--converters]
                                            [--keep-list] [--jobs 2] [--keep DIR]
    python benchmarks/architecture_sweep.py --census docs/census.md [--only ...] [--jobs 1]
    python benchmarks/architecture_sweep.py --census-check docs/census.md
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import census  # benchmarks/census.py: the census page (this folder is on sys.path when the script runs)

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, pad_token_id=0,
             bos_token_id=0, eos_token_id=1, intermediate_size=64, vocab_size=128, max_position_embeddings=64,
             head_dim=16, d_model=32, n_embd=32, n_layer=2, n_head=2, n_positions=64, d_kv=16, num_layers=1,
             num_heads=2, d_ff=64, image_size=32, patch_size=8, num_channels=3, embedding_size=16, hidden_act="gelu")
TEXT = ["BertModel", "DistilBertModel", "RobertaModel", "DebertaV2Model", "ElectraModel", "MPNetModel", "AlbertModel",
        "XLMRobertaModel", "ModernBertModel", "GPT2Model", "GPTNeoXModel", "OPTModel", "BloomModel", "FalconModel",
        "LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model", "PhiModel", "Phi3Model", "GemmaModel",
        "Gemma2Model", "StableLmModel", "OlmoModel", "CohereModel", "GraniteModel", "T5EncoderModel",
        "MT5EncoderModel"]
VISION = ["ViTModel", "DeiTModel", "BeitModel", "Dinov2Model", "CLIPVisionModel", "SwinModel", "ConvNextModel",
          "ConvNextV2Model", "ResNetModel", "MobileNetV2Model", "SegformerModel", "PoolFormerModel", "RegNetModel",
          "EfficientNetModel", "LevitModel", "MobileViTModel"]
AUDIO = ["Wav2Vec2Model", "HubertModel", "WhisperEncoder"]
# per-architecture settings the shared SMALL sizes do not cover (lists of stages, conv stacks)
_STAGES = dict(hidden_sizes=[8, 16], depths=[1, 1])
SPECIAL = {
    "ConvNextModel": dict(_STAGES, num_stages=2), "ConvNextV2Model": dict(_STAGES, num_stages=2),
    "ResNetModel": dict(_STAGES, embedding_size=8), "RegNetModel": dict(_STAGES, embedding_size=8, groups_width=8),
    "PoolFormerModel": dict(_STAGES, num_encoder_blocks=2, strides=[4, 2], padding=[2, 1], patch_sizes=[7, 3]),
    "SwinModel": dict(embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2, patch_size=4),
    "SegformerModel": dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                           patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
    "MobileNetV2Model": dict(depth_multiplier=0.25),
    "EfficientNetModel": dict(width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128),
    "LevitModel": dict(hidden_sizes=[16, 32], num_attention_heads=[1, 2], depths=[1, 1], key_dim=[8, 8],
                       drop_path_rate=0, patch_size=16, mlp_ratio=[2, 2], attention_ratio=[2, 2],
                       down_ops=[["Subsample", 8, 2, 4, 2, 2]]),
    "MobileViTModel": dict(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], patch_size=2),
    "Wav2Vec2Model": dict(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2,
                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2),
    "CLIPVisionModel": dict(projection_dim=16),
}
SPECIAL["HubertModel"] = SPECIAL["Wav2Vec2Model"]
_LARGE_IMAGES = {"ConvNextModel", "ConvNextV2Model", "ResNetModel", "RegNetModel", "PoolFormerModel", "SegformerModel",
                 "MobileNetV2Model", "EfficientNetModel", "MobileViTModel"}


# ---- the child process: build and export one architecture -------------------------------------------------------


def _build(name: str, dynamic: bool):
    """(module, example args, input names, dynamic axes by input) for one architecture."""
    import torch
    import transformers as tf

    class Wrap(torch.nn.Module):
        def __init__(self, model, keys):
            super().__init__()
            self.model, self.keys = model, keys

        def forward(self, *args):
            out = self.model(**dict(zip(self.keys, args)), return_dict=True)
            return out.last_hidden_state if getattr(out, "last_hidden_state", None) is not None else out[0]

    class WithMask(torch.nn.Module):  # named arguments: torch.export matches dynamic_shapes to them by name
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state

    torch.manual_seed(0)
    if name == "WhisperEncoder":
        config = tf.WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                                  max_source_positions=16, vocab_size=128, pad_token_id=0, bos_token_id=0,
                                  eos_token_id=1, decoder_start_token_id=0)
        return Wrap(tf.WhisperModel(config).get_encoder().eval(), ["input_features"]), (torch.randn(1, 16, 32),), \
            ["x"], None
    cls = getattr(tf, name)
    config = cls.config_class()
    for key, value in {**SMALL, **SPECIAL.get(name, {})}.items():
        if hasattr(config, key) or (name in SPECIAL and key in SPECIAL[name]):
            with contextlib.suppress(Exception):
                setattr(config, key, value)
    if dynamic and hasattr(config, "use_cache"):
        config.use_cache = False  # (without a mask, the cache-free causal mask needs aten::diff: no TorchScript export)
    model = cls(config).eval()
    if name in VISION:
        size = 64 if name in _LARGE_IMAGES else 32
        return Wrap(model, ["pixel_values"]), (torch.randn(1, 3, size, size),), ["x"], None
    if name in AUDIO:
        return Wrap(model, ["input_values"]), (torch.randn(1, 400),), ["x"], None
    if not dynamic:
        return Wrap(model, ["input_ids"]), (torch.randint(0, 128, (1, 16)),), ["x"], None
    ids, mask = torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    names = ["input_ids", "attention_mask"]
    return WithMask(model), (ids, mask), names, {n: {0: "batch", 1: "seq"} for n in names}


def export_one(name: str, folder: str, dynamic: bool) -> None:
    """Child process: export one architecture with both exporters; print {exporter: "ok" | error} as JSON."""
    import torch

    status: dict[str, str] = {}
    try:
        module, args, names, axes = _build(name, dynamic)
        with torch.no_grad():
            module(*args)
    except Exception as exc:  # a config these sizes do not fit: reported, the sweep goes on
        print(json.dumps({"build": f"{type(exc).__name__}: {str(exc)[:200]}"}))
        return
    for exporter in ("torchscript", "dynamo"):
        path = Path(folder) / f"{name}-{exporter}.onnx"
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                if exporter == "torchscript":
                    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=names,
                                      dynamic_axes=axes)
                else:
                    shapes = None
                    if axes:
                        batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=512)
                        shapes = {n: {0: batch, 1: seq} for n in names}
                    torch.onnx.export(module, args, str(path), dynamo=True, input_names=names, dynamic_shapes=shapes)
            status[exporter] = "ok"
        except Exception as exc:
            status[exporter] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:150]}"
    print(json.dumps(status))


# ---- the census child: every mode of one export, through the Python API -------------------------------------

CENSUS_TIMEOUT = 1800  # seconds one export's child may take for every mode (a hung trace must not stop the sweep)


def _short(exc: BaseException, folder: str) -> str:
    """An exception as one line of the census, without the scratch folder (a rerun's differs)."""
    text = (str(exc).splitlines() or [""])[0].replace(folder + "/", "").replace(folder, "")
    return f"{type(exc).__name__}: {text[:150]}"


def _audit_value(report, folder: str) -> dict:
    """An audit as the census stores it: rule counts, the (rule, node) sites, how many are errors; or its error."""
    if report.errors:
        return {"error": _short(report.errors[0], folder)}
    findings = report.findings
    sites = sorted({(f.rule_id, f.node_name) for f in findings})
    return {"counts": dict(sorted(collections.Counter(f.rule_id for f in findings).items())),
            "sites": [list(s) for s in sites], "errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings)}


def _keep_list_value(path: str) -> dict:
    import precaudit

    keep = precaudit.keep_list(path, "onnxruntime", config=None)
    counts = keep.op_type_counts()
    rules = sorted({f.rule_id for e in keep.entries if not e.dropped and e.nodes for f in e.findings})
    return {"kept": len(keep.nodes), "blocked": sum(counts.values()), "op_types": counts, "exit": keep.exit_code,
            "rules": rules}


def _fix_value(path: str, folder: str) -> dict:
    import precaudit

    out = str(Path(path).with_suffix(".fixed.onnx"))
    result = precaudit.fix(path, out, config=None)
    value = {"exit": result.exit_code, "written": result.written, "repairs": len(result.plan.repairs),
             "to_repair": sum(f.severity in ("error", "warning") for f in result.before),
             "withheld": len(result.withheld), "left": len(result.plan.skipped)}
    if result.written:
        report = precaudit.audit(out, "fp16", config=None)
        value["after"] = _audit_value(report, folder)
        value["clean"] = not report.errors and not any(f.severity in ("error", "warning") for f in report.findings)
    return value


def _coreml_value(path: str, folder: str) -> dict:
    """--runtime coreml audits the PyTorch module (coremltools converts modules, not ONNX files): the architecture
    the export was made from, built again as export_one builds it."""
    import precaudit

    name = Path(path).stem.rsplit("-", 1)[0]
    module, args, _, _ = _build(name, False)
    return _audit_value(precaudit.audit(module, "fp16", runtime="coreml", example_inputs=args, config=None), folder)


def census_one(path: str) -> None:
    """Child process: every census mode of one export, one JSON line per mode as each finishes (a crash later on
    loses only the modes after it)."""
    import precaudit

    folder = str(Path(path).parent)
    modes: list[tuple[str, Callable[[], dict]]] = [
        (d, lambda d=d: _audit_value(precaudit.audit(path, d, config=None), folder)) for d in census.STATIC_DTYPES]
    modes.append(("trace", lambda: _audit_value(precaudit.audit(path, "fp16", trace=True, config=None), folder)))
    modes += [(f"converter:{c}", lambda c=c: _audit_value(precaudit.audit(path, "fp16", converter=c, config=None),
                                                            folder)) for c in census.CONVERTERS]
    modes += [("keep_list", lambda: _keep_list_value(path)), ("fix", lambda: _fix_value(path, folder))]
    modes += [(f"runtime:{r}", lambda r=r: _audit_value(precaudit.audit(path, "fp16", runtime=r, config=None), folder))
              for r in census.RUNTIMES if r != "coreml"]
    modes.append(("runtime:coreml", lambda: _coreml_value(path, folder)))
    for mode, run in modes:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                value = run()
        except precaudit.InputError as exc:  # what the command line reports with exit 2: a limitation, not a crash
            value = {"error": _short(exc, folder)}
        except Exception as exc:  # any other exception the API lets out is a bug in precaudit: the census says so
            value = {"failed": _short(exc, folder)}
        print(json.dumps({"mode": mode, "value": value}), flush=True)


# ---- the parent: audit each export --------------------------------------------------------------------------


def _audit(model: Path, *args: str) -> str:
    """Rule counts of one audit ('-' for none), or the error; FAILED with the last line of a traceback."""
    out = model.with_suffix(f".{abs(hash(args))}.json")
    run = subprocess.run([sys.executable, "-m", "precaudit", str(model), *args, "--format", "json", "-o", str(out),
                          "--fail-on", "never"], capture_output=True, text=True)
    if "Traceback" in run.stderr:
        return "FAILED " + run.stderr.strip().splitlines()[-1][:150]
    try:
        report = json.loads(out.read_text())
    except (OSError, ValueError):
        return f"exit {run.returncode}: {run.stderr.strip()[:150]}"
    if report["errors"]:
        return "error: " + report["errors"][0]["message"][:150]
    counts = collections.Counter(r["rule_id"] for r in report["results"])
    return " ".join(f"{k}x{v}" for k, v in sorted(counts.items())) or "-"


def _keep_list_check(model: Path) -> str:
    """Run `keep-list --for onnxruntime`'s snippet as printed, and the converter with no list; audit both."""
    run = subprocess.run([sys.executable, "-m", "precaudit", "keep-list", str(model), "--for", "onnxruntime",
                          "--format", "json"], capture_output=True, text=True)
    if run.returncode != 0:
        return f"keep-list exit {run.returncode}: {run.stderr.strip()[:150]}"
    snippet = json.loads(run.stdout)["snippet"]
    kept, plain = model.with_suffix(".kept.onnx"), model.with_suffix(".plain.onnx")
    target = snippet.rsplit("save_model_to_file(", 1)[1].split(")")[0]
    with_list = snippet.replace(target, repr(str(kept)))
    head = with_list.split("    node_block_list=")[0] if "node_block_list=" in with_list else None
    without = (head + ")\nonnx_model.save_model_to_file(" + repr(str(plain)) + ")\n") if head else \
        with_list.replace(repr(str(kept)), repr(str(plain)))
    for code in (with_list, without):
        convert = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if convert.returncode != 0:
            return "conversion failed: " + convert.stderr.strip().splitlines()[-1][:150]
    return f"kept: {_audit(kept)} | no list: {_audit(plain)}"


# ---- the census parent: one row per export, the page rendered as rows arrive ------------------------------------


def _census_child(model: Path) -> dict:
    """Run census_one on one export in its own process group; {mode: value}, every mode it did not report FAILED
    with the reason (a crash, a timeout)."""
    import os
    import signal

    child = subprocess.Popen([sys.executable, __file__, "--census-one", str(model)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=CENSUS_TIMEOUT)
        why = f"child exited {child.returncode}: " + ((err.strip().splitlines() or [""])[-1][:150])
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child and any converter it started, by the group it leads
        out, _ = child.communicate()
        why = f"timed out after {CENSUS_TIMEOUT} s"
    values = {}
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            values[message["mode"]] = message["value"]
    modes = [*census.STATIC_DTYPES, "trace", *(f"converter:{c}" for c in census.CONVERTERS), "keep_list", "fix",
             *(f"runtime:{r}" for r in census.RUNTIMES)]
    return {mode: values.get(mode, {"failed": why.replace(str(model.parent) + "/", "")}) for mode in modes}


def _row(name: str, exporter: str, values: dict) -> dict:
    row = {"architecture": name, "family": census.FAMILY_OF.get(name, "other"), "exporter": exporter,
           **{k: v for k, v in values.items() if not k.startswith(("converter:", "runtime:"))}}
    row["converters"] = {c: values[f"converter:{c}"] for c in census.CONVERTERS}
    row["runtimes"] = {r: values[f"runtime:{r}"] for r in census.RUNTIMES}
    return row


def _meta(scope: str, seconds: float, jobs: int) -> dict:
    """What the rows were measured with: the versions, precaudit's commit, the machine, and the run's timing."""
    import os
    import platform
    from importlib import metadata

    import precaudit

    versions = {"python": platform.python_version()}
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "onnxconverter-common"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["precaudit"] = precaudit.__version__
    from precaudit.rules.loader import load_rules
    rules = {r.id: {"name": r.name, "severity": r.severity} for r in load_rules()}  # the page names and links them
    source = Path(precaudit.__file__).resolve().parent.parent
    git = ["git", "-C", str(source)]
    commit = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "precaudit", "benchmarks/architecture_sweep.py",
                            "benchmarks/census.py"], capture_output=True, text=True).stdout.strip()
    return {"versions": versions, "commit": (commit or "unknown") + (" (with uncommitted changes)" if dirty else ""),
            "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}, {platform.system()}), shared",
            "scope": scope, "seconds": round(seconds, 1), "jobs": jobs, "date": _now(), "rules": rules}


def _now() -> str:
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_census(names: list[str], page: Path, jobs: int, folder: Path, subset: bool) -> dict:
    """Export and audit every architecture in names, writing the page after each one (an interrupted run leaves a
    page that says how far it got); returns the data of the finished run."""
    import time

    start = time.monotonic()
    everything = len(TEXT + VISION + AUDIO)
    scope = (f"a subset: {len(names)} of the sweep's {everything} architectures ({', '.join(names)})" if subset
             else f"all {everything} architectures of the sweep (TEXT, VISION and AUDIO)")
    rows: list[dict] = []
    meta = _meta(scope, 0.0, jobs)  # the commit and versions as the run starts (a commit during the run is not it)

    def one(name: str) -> list[dict]:
        status = _export(name, folder, False)
        found = []
        for exporter in ("torchscript", "dynamo"):
            verdict = status.get(exporter, status.get("build", "not run"))
            if verdict != "ok":
                found.append({"architecture": name, "family": census.FAMILY_OF.get(name, "other"), "exporter": exporter,
                              "not_exported": verdict})
                continue
            found.append(_row(name, exporter, _census_child(folder / f"{name}-{exporter}.onnx")))
        print(f"census: {name} done ({time.monotonic() - start:.0f} s)", flush=True)
        return found

    with ThreadPoolExecutor(jobs) as pool:
        for done, found in enumerate(pool.map(one, names), 1):
            rows += found
            partial = scope if done == len(names) else f"INCOMPLETE run, {done} of {len(names)} done so far: {scope}"
            meta.update(scope=partial, seconds=round(time.monotonic() - start, 1), date=_now())
            data = {"meta": dict(meta), "rows": rows}
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(census.render(data), encoding="utf-8")
    return data


def _export(name: str, folder: Path, dynamic: bool) -> dict:
    """{exporter: "ok" | error} from export_one in its own process (or {"build": error})."""
    run = subprocess.run([sys.executable, __file__, "--export-one", name, str(folder),
                          "dynamic" if dynamic else "static"], capture_output=True, text=True)
    lines = run.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"build": run.stderr.strip()[-200:]}


def census_main(args, folder: Path) -> int:
    """--census PAGE writes the page; --census-check PAGE reruns the same architectures into a scratch page and
    compares the data with PAGE's: the differing rows printed, exit 1 on any difference."""
    names = args.only.split(",") if args.only else TEXT + VISION + AUDIO
    if args.census_check:
        committed = census.read_data(args.census_check)
        if not args.only:  # rerun what the page measured, not more
            names = list(dict.fromkeys(r["architecture"] for r in committed["rows"]))
        subset = committed["meta"]["scope"].startswith("a subset") or "INCOMPLETE" in committed["meta"]["scope"]
        rerun = run_census(names, folder / "census.md", args.jobs, folder, subset=bool(args.only) or subset)
        found = census.differences(committed, rerun)
        if not census.renders_itself(args.census_check.read_text(encoding="utf-8")):
            found.append(f"{args.census_check}: its text is not what its own data renders to (edited by hand?)")
        print("\n".join(found) if found else f"census matches {args.census_check}")
        return 1 if found else 0
    run_census(names, args.census, args.jobs, folder, subset=bool(args.only))
    print(f"census written to {args.census}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated architectures (class names) to sweep")
    parser.add_argument("--dynamic", action="store_true", help="text models with attention_mask, dynamic shapes")
    parser.add_argument("--converters", action="store_true", help="also audit under each --converter")
    parser.add_argument("--keep-list", action="store_true", help="also run keep-list's snippet end to end")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="export here and keep the models")
    parser.add_argument("--census", type=Path, metavar="PAGE", help="write the precision census to PAGE")
    parser.add_argument("--census-check", type=Path, metavar="PAGE",
                        help="rerun the census PAGE holds; exit 1 if its data differs")
    parser.add_argument("--export-one", nargs=3, help=argparse.SUPPRESS)  # the child processes
    parser.add_argument("--census-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_one:
        export_one(args.export_one[0], args.export_one[1], args.export_one[2] == "dynamic")
        return 0
    if args.census_one:
        census_one(args.census_one)
        return 0
    if args.census or args.census_check:
        with contextlib.ExitStack() as stack:
            folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="precaudit-census-")))
            folder.mkdir(parents=True, exist_ok=True)
            return census_main(args, folder)
    names = args.only.split(",") if args.only else (TEXT if args.dynamic else TEXT + VISION + AUDIO)
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="precaudit-sweep-")))
        folder.mkdir(parents=True, exist_ok=True)

        def export(name: str) -> tuple[str, dict]:
            return name, _export(name, folder, args.dynamic)

        modes = [("fp16", ("--dtype", "fp16")), ("bf16", ("--dtype", "bf16")), ("trace", ("--trace",))]
        if args.converters:
            modes += [(c, ("--converter", c)) for c in ("onnxconverter-common", "modelopt", "onnxruntime")]

        def audit(model: Path) -> str:
            line = "  ".join(f"{tag}: {_audit(model, *opts)}" for tag, opts in modes)
            if args.keep_list:
                line += f"  keep-list: {_keep_list_check(model)}"
            return f"{model.stem:36s} {line}"

        failed = 0
        with ThreadPoolExecutor(args.jobs) as pool:
            exported = list(pool.map(export, names))
            models = []
            for name, status in exported:
                for exporter, verdict in status.items():
                    if verdict == "ok":
                        models.append(folder / f"{name}-{exporter}.onnx")
                    else:
                        print(f"{name}-{exporter}: not exported ({verdict})")
            for line in pool.map(audit, models):
                failed += "FAILED" in line
                print(line, flush=True)
        print(f"{len(models)} exports audited, {failed} with a traceback")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
