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
--dynamic, text models are exported with (input_ids, attention_mask) and dynamic batch and sequence instead. The
exports go in a temporary folder (or --keep DIR). Needs torch, transformers, onnxscript and onnxruntime; the
session that added it ran 47 architectures (docs/analysis.md, "Validation on real exports").

    python benchmarks/architecture_sweep.py [--only LlamaModel,T5EncoderModel] [--dynamic] [--converters]
                                            [--keep-list] [--jobs 2] [--keep DIR]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
        if hasattr(config, key) or name in SPECIAL and key in SPECIAL[name]:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated architectures (class names) to sweep")
    parser.add_argument("--dynamic", action="store_true", help="text models with attention_mask, dynamic shapes")
    parser.add_argument("--converters", action="store_true", help="also audit under each --converter")
    parser.add_argument("--keep-list", action="store_true", help="also run keep-list's snippet end to end")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="export here and keep the models")
    parser.add_argument("--export-one", nargs=3, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.export_one:
        export_one(args.export_one[0], args.export_one[1], args.export_one[2] == "dynamic")
        return 0
    names = args.only.split(",") if args.only else (TEXT if args.dynamic else TEXT + VISION + AUDIO)
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="precaudit-sweep-")))
        folder.mkdir(parents=True, exist_ok=True)

        def export(name: str) -> tuple[str, dict]:
            run = subprocess.run([sys.executable, __file__, "--export-one", name, str(folder),
                                  "dynamic" if args.dynamic else "static"], capture_output=True, text=True)
            lines = run.stdout.strip().splitlines()
            return name, json.loads(lines[-1]) if lines else {"build": run.stderr.strip()[-200:]}

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
