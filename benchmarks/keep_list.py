"""Verified keep-lists against the two lists users reach for, on exported transformers and CNNs, in one run.

For each model (exported here with random weights; the hazards are real ones, made on purpose where named):

  keep-list         `precaudit keep-list --for onnxruntime --trace`: the static list, grown and pruned by emulation
  docs' op types    blocking every node of the op types the converters' docs and threads recommend
                    (LayerNormalization, Softmax, Pow, ReduceMean, Sqrt, Div: ORT's T5 helper, TensorRT's warning)
  modelopt |x|>512  modelopt AutoCast's IORangeRule at its default data_max: every node with a float input or
                    output whose |x| passes 512 in the float32 reference on the same inputs (precaudit's traced
                    ranges; AutoCast also judges integer tensors, left out here)

each emulated in float16 by precaudit (onnxruntime 1.32.0's converter model: its default op block list, constants
clamped to the float16 range) on the same synthesized batch. Printed per model and list: the nodes kept (of all
nodes), whether every output is finite, the largest output error relative to that output's largest |value|, the
error and warning findings a static audit still makes with the list kept (an eps that underflows in a norm whose
Add runs in float16 hurts only on the rows that hit it: random inputs do not), and for the keep-list the
emulation runs and the wall time of the whole command. Needs torch and transformers.

    python benchmarks/keep_list.py [--seq 32] [--tolerance 0.01]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
import warnings
from pathlib import Path

DOC_OPS = ["LayerNormalization", "Softmax", "Pow", "ReduceMean", "Sqrt", "Div"]


def _export(module, args: tuple, path: Path, names: list[str]) -> Path:
    import torch

    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=False, opset_version=14, input_names=names)
    return path


class _Hidden:
    """Call a transformers model by keyword (TorchScript passes positionals) and return its first output."""

    @staticmethod
    def wrap(model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids):
                return self.model(input_ids=input_ids, return_dict=False)[0]

        return Wrapped()


def bert(folder: Path, seq: int) -> Path:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                           vocab_size=1000)
    return _export(_Hidden.wrap(tf.BertModel(config)), (torch.randint(0, 1000, (1, seq)),), folder / "bert.onnx",
                   ["input_ids"])


def gpt2(folder: Path, seq: int) -> Path:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=max(64, seq))
    return _export(_Hidden.wrap(tf.GPT2Model(config)), (torch.randint(0, 1000, (1, seq)),), folder / "gpt2.onnx",
                   ["input_ids"])


def t5_hot_wo(folder: Path, seq: int) -> Path:
    """A T5 encoder whose second block's DenseReluDense.wo is scaled up: its output passes 65504
    (transformers#5651), and T5's pre-norm residual stream carries it on to the final norm."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.T5Config(d_model=256, d_ff=1024, num_layers=4, num_heads=4, d_kv=64, vocab_size=1000)
    model = tf.T5EncoderModel(config)
    with torch.no_grad():
        model.encoder.block[1].layer[1].DenseReluDense.wo.weight.mul_(3e5)
    return _export(_Hidden.wrap(model), (torch.randint(0, 1000, (1, seq)),), folder / "t5_hot_wo.onnx", ["input_ids"])


def ffn_overflow(folder: Path, seq: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fixtures.keep_list_models import ffn_overflow_transformer

    return ffn_overflow_transformer(folder / "ffn_overflow.onnx", layers=6, hot=3, seq=seq)


def convnext(folder: Path, seq: int) -> Path:
    """ConvNeXt-style: 7x7 depthwise conv, channels-last LayerNorm, 4x MLP with GELU, residual; 4 stages."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.up, self.act, self.down = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            return x + self.down(self.act(self.up(self.norm(y)))).permute(0, 3, 1, 2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [32, 64, 128, 256]
            layers = [nn.Conv2d(3, dims[0], 4, stride=4)]
            for i, dim in enumerate(dims):
                layers += [Block(dim), Block(dim)]
                if i + 1 < len(dims):
                    layers.append(nn.Conv2d(dim, dims[i + 1], 2, stride=2))
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(dims[-1], 10)

        def forward(self, x):
            return self.head(self.body(x).mean((2, 3)))

    torch.manual_seed(0)
    return _export(Net(), (torch.randn(1, 3, 2 * seq, 2 * seq),), folder / "convnext.onnx", ["pixels"])


MODELS = {"BERT (4 layers, 256)": bert, "GPT-2 (4 layers, 256)": gpt2, "T5 encoder, wo ×3e5 in block 1": t5_hot_wo,
          "post-LN FFN overflow (6 layers)": ffn_overflow, "ConvNeXt-style CNN (8 blocks)": convnext}


def run(name: str, path: Path, seq: int, tolerance: float) -> list[tuple]:
    from precaudit.config import load_settings
    from precaudit.context import Audit
    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx import load_onnx
    from precaudit.keeplist import build_keep_list, static_findings
    from precaudit.keeplist.verify import emulate
    from precaudit.options import TraceOptions
    from precaudit.trace.inputs import synthesize_inputs

    deployment = Deployment.named("fp16", "onnxruntime")

    def left(graph, kept) -> int:
        resolver = deployment.resolver(graph, keep_nodes=kept)
        return sum(f.severity in ("error", "warning") for f in static_findings(graph, resolver, rules, str(path), False))

    dims: dict[str, int] = {}  # the exports have fixed shapes: (1, seq) tokens, (1, 3, 2·seq, 2·seq) pixels
    audit = Audit.of(load_settings({}, config=None), inputs=TraceOptions(dims=dims, seed=0), traced=True)
    rules = audit.rules
    start = time.perf_counter()
    keep = build_keep_list(audit, str(path), "onnxruntime", tolerance=tolerance)
    seconds = time.perf_counter() - start
    graph = keep.graph
    final = keep.verification.final
    rows = [(name, "keep-list", len(keep.nodes), len(graph.nodes), final.finite, final.error,
             left(graph, keep.nodes), f"{keep.verification.runs} runs, {seconds:.1f} s")]
    graph = load_onnx(str(path))
    batches = [synthesize_inputs(graph, dims, 0)]
    plain = emulate(graph, deployment, [], batches, "auto")
    docs = [n for n in graph.nodes if n.op_type in DOC_OPS]
    docs_run = emulate(graph, deployment, docs, batches, "auto")
    rows.append((name, "docs' op types", len(docs), len(graph.nodes), docs_run.finite, docs_run.error,
                 left(graph, docs), ""))
    hot = [n for n in graph.nodes if n.op_type != "Constant" and not n.subgraph_path and any(
        plain.absmax.get(id(v), 0.0) > 512 for v in [*n.inputs, *n.outputs] if v is not None and not v.is_const)]
    hot_run = emulate(graph, deployment, hot, batches, "auto")
    rows.append((name, "modelopt |x|>512", len(hot), len(graph.nodes), hot_run.finite, hot_run.error,
                 left(graph, hot), ""))
    rows.append((name, "nothing kept", 0, len(graph.nodes), plain.finite, plain.error, left(graph, []), ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()
    print("| model | list | nodes kept (of all) | outputs finite | output error | findings left | |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in MODELS.items():
            path = build(Path(tmp), args.seq)
            for model, label, kept, total, finite, error, findings, note in run(name, path, args.seq, args.tolerance):
                shown = "inf/NaN" if not finite else f"{error:.2e}"
                print(f"| {model} | {label} | {kept} ({total}) | {'yes' if finite else 'no'} | {shown} | {findings} "
                      f"| {note} |", flush=True)


if __name__ == "__main__":
    main()
