"""Export a small real transformer, audit it with `precaudit --trace --format html`, and screenshot the page.

The model is a transformers BERT (or T5 encoder) from a small config with random weights, called with a padded
attention mask and exported by the TorchScript ONNX exporter: by default in float32 at opset 14, where every
LayerNorm is written out, and audited as the float16 model a converter would make of it (docs/reports.md's
screenshot); --export-dtype fp16 exports model.half() instead (a T5's RMSNorms then upcast: float32 islands).
The page is opened in headless Chromium, as a person opens the report, and saved as a PNG. Debian's `chromium`
package is installed with apt-get when no chromium is found (needs root). Needs torch and transformers.

    python examples/html_screenshot.py [--model bert|t5] [--layers 8] [--export-dtype fp32|fp16] [--opset 14]
                                       [--out docs/html_report.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars"]


def chromium() -> str:
    """The chromium binary, installed from Debian's packages if there is none."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    print("installing Debian's chromium (apt-get) ...", file=sys.stderr)
    subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], check=True,
                   stdout=subprocess.DEVNULL)
    return shutil.which("chromium") or sys.exit("chromium is not on PATH after apt-get install chromium")


def export(kind: str, layers: int, path: Path, dtype: str = "fp32", opset: int = 14) -> None:
    """A random-init transformers encoder, converted with model.half() for fp16, exported by TorchScript."""
    import torch
    import transformers as tf

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    torch.manual_seed(0)
    if kind == "t5":
        config = tf.T5Config(d_model=256, d_kv=32, num_heads=8, d_ff=1024, num_layers=layers, vocab_size=1000,
                             attn_implementation="eager")
        model = tf.T5EncoderModel(config)
    else:
        config = tf.BertConfig(hidden_size=256, num_hidden_layers=layers, num_attention_heads=4,
                               intermediate_size=1024, vocab_size=1000, attn_implementation="eager")
        model = tf.BertModel(config)
    module = LastHiddenState(model).eval()
    if dtype == "fp16":
        module = module.half()
    ids = torch.randint(0, 1000, (2, 32))
    mask = torch.ones(2, 32, dtype=torch.int64)
    mask[1, 20:] = 0  # a padded second sequence, as a served batch has
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask), str(path), dynamo=False, opset_version=opset,
                          input_names=["input_ids", "attention_mask"])


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1640) -> None:
    subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--screenshot={png}", f"--window-size={width},{height}",
                    page.resolve().as_uri()], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("bert", "t5"), default="bert")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--export-dtype", choices=("fp32", "fp16"), default="fp32",
                        help="fp32: audit the float32 export as a converter would run it in float16")
    parser.add_argument("--opset", type=int, default=14)
    parser.add_argument("--out", type=Path, default=Path("docs/html_report.png"))
    parser.add_argument("--height", type=int, default=1640, help="window height in pixels (the first screen)")
    parser.add_argument("--keep", type=Path, help="keep the model and the report in this folder")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        model, report = folder / f"{args.model}_{args.export_dtype}.onnx", folder / "report.html"
        export(args.model, args.layers, model, args.export_dtype, args.opset)
        # exit 1 only says there are findings; 2 is a failure
        code = subprocess.run([sys.executable, "-m", "precaudit", model.name, "--dtype", "fp16", "--trace", "--format",
                               "html", "-o", report.name], cwd=folder, check=False).returncode
        if code not in (0, 1):
            return code
        args.out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(report, args.out, height=args.height)
    print(f"{args.out} ({args.out.stat().st_size // 1024} KB) from {report if args.keep else 'a temporary report'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
