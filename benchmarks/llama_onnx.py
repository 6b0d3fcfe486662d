"""Write a Llama-shaped decoder as ONNX with onnx.helper, weights streamed tensor by tensor into external data.

The graph follows what the TorchScript exporter (opset 17) writes for a transformers LlamaModel in fp16: token
embedding (Gather), per layer a decomposed RMSNorm that upcasts to float32 (Cast, Pow, ReduceMean, Add eps, Sqrt,
Reciprocal, Mul, Cast back, Mul weight), attention with grouped KV heads, rotary embedding (Slice, Neg, Concat),
a float32 softmax, SiLU MLP and residual Adds, the dynamic-shape plumbing of Reshapes (Shape, Gather, Unsqueeze,
Concat) and scalar Constant nodes; then a final norm and the LM head. No torch needed, nothing kept in memory but
one tensor at a time: a 7B-shaped model is written in a minute and takes no more memory than its largest weight.

weights="sparse" leaves the data as holes in the file (a static audit never reads it: quick and takes no disk);
weights="random" writes N(0, 0.02) values, as a random init would (traced mode computes with them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

__all__ = ["SHAPES", "LlamaShape", "write_llama"]


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        hd, kv = self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * (2 * self.hidden + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden + 0 * hd


SHAPES = {
    "tinyllama-1.1b": LlamaShape(22, 2048, 5632, 32, 4, 32000),
    "llama-7b": LlamaShape(32, 4096, 11008, 32, 32, 32000, eps=1e-6),
}


class _Writer:
    """Nodes, initializers (external, appended to one data file) and fresh names."""

    def __init__(self, folder: Path, weights: str, seed: int):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.data = open(folder / "model.weights", "wb")  # noqa: SIM115 -- written by every add(), closed by finish()
        self.offset = 0
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def node(self, op: str, inputs: list[str], scope: str, n_out: int = 1, **attrs) -> list[str] | str:
        outs = [self.name(f"{scope}/{op}") for _ in range(n_out)]
        self.nodes.append(h.make_node(op, inputs, outs, name=f"{scope}/{op}_{self.count}", **attrs))
        return outs[0] if n_out == 1 else outs

    def scalar(self, value: float, scope: str, dtype=np.float32) -> str:
        """A scalar as the TorchScript exporter writes it: a Constant node."""
        out = self.name(f"{scope}/Constant")
        self.nodes.append(h.make_node("Constant", [], [out], name=out,
                                      value=numpy_helper.from_array(np.array(value, dtype=dtype))))
        return out

    def ints(self, values: list[int], name: str) -> str:
        self.inits.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], ones: bool = False) -> str:
        """An fp16 weight written to the data file now (or left as a hole), referenced as external data."""
        count = int(np.prod(shape))
        nbytes = count * 2
        if self.weights == "random" or ones:
            chunk = 1 << 24
            for start in range(0, count, chunk):
                n = min(chunk, count - start)
                block = np.ones(n, np.float16) if ones else (self.rng.standard_normal(n, np.float32) * 0.02)
                self.data.write(block.astype(np.float16).tobytes())
        else:
            self.data.seek(self.offset + nbytes)
        tensor = T(name=name, data_type=T.FLOAT16, dims=list(shape), data_location=T.EXTERNAL)
        for key, value in (("location", "model.weights"), ("offset", str(self.offset)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.inits.append(tensor)
        self.offset += nbytes
        return name

    def close(self) -> None:
        self.data.truncate(self.offset)
        self.data.close()


def _rms_norm(w: _Writer, x: str, weight: str, eps: float, scope: str, axes: str) -> str:
    x32 = w.node("Cast", [x], scope, to=T.FLOAT)
    sq = w.node("Pow", [x32, w.scalar(2.0, scope)], scope)
    var = w.node("ReduceMean", [sq], scope, axes=[-1], keepdims=1)
    ve = w.node("Add", [var, w.scalar(eps, scope)], scope)
    rs = w.node("Reciprocal", [w.node("Sqrt", [ve], scope)], scope)
    n16 = w.node("Cast", [w.node("Mul", [x32, rs], scope)], scope, to=T.FLOAT16)
    return w.node("Mul", [weight, n16], scope)


def _reshape_dynamic(w: _Writer, x: str, like: str, tail: list[int], scope: str) -> str:
    """Reshape to [batch, seq, *tail] with batch and seq read off `like` at run time, as traced exports do."""
    shape = w.node("Shape", [like], scope)
    dims = [w.node("Unsqueeze", [w.node("Gather", [shape, w.scalar(i, scope, np.int64)], scope, axis=0),
                                 w.ints([0], w.name("axes0"))], scope) for i in (0, 1)]
    target = w.node("Concat", [*dims, w.ints(tail, w.name("tail"))], scope, axis=0)
    return w.node("Reshape", [x, target], scope)


def _rotary(w: _Writer, x: str, cos: str, sin: str, half: int, scope: str, starts: dict[str, str]) -> str:
    first = w.node("Slice", [x, starts["zero"], starts["half"], starts["last"]], scope)
    second = w.node("Slice", [x, starts["half"], starts["max"], starts["last"]], scope)
    rotated = w.node("Concat", [w.node("Neg", [second], scope), first], scope, axis=-1)
    return w.node("Add", [w.node("Mul", [x, cos], scope), w.node("Mul", [rotated, sin], scope)], scope)


def _layer(w: _Writer, i: int, hidden: str, s: LlamaShape, rope: tuple[str, str], starts: dict[str, str]) -> str:
    scope = f"/model/layers.{i}"
    hd, kv = s.head_dim, s.kv_heads * s.head_dim
    y = _rms_norm(w, hidden, w.weight(f"model.layers.{i}.input_layernorm.weight", (s.hidden,), ones=True), s.eps,
                  f"{scope}/input_layernorm", "")
    heads = {}
    for proj, width, n in (("q", s.hidden, s.heads), ("k", kv, s.kv_heads), ("v", kv, s.kv_heads)):
        out = w.node("MatMul", [y, w.weight(f"model.layers.{i}.self_attn.{proj}_proj.weight", (s.hidden, width))],
                     f"{scope}/self_attn/{proj}_proj")
        out = _reshape_dynamic(w, out, y, [n, hd], f"{scope}/self_attn")
        heads[proj] = w.node("Transpose", [out], f"{scope}/self_attn", perm=[0, 2, 1, 3])
    q = _rotary(w, heads["q"], *rope, hd // 2, f"{scope}/self_attn", starts)
    k = _rotary(w, heads["k"], *rope, hd // 2, f"{scope}/self_attn", starts)
    v = heads["v"]
    if s.kv_heads != s.heads:  # repeat_kv: each KV head serves heads // kv_heads query heads
        reps = w.ints([1, s.heads // s.kv_heads, 1, 1], w.name("reps"))
        k, v = (w.node("Tile", [t, reps], f"{scope}/self_attn") for t in (k, v))
    scores = w.node("MatMul", [q, w.node("Transpose", [k], f"{scope}/self_attn", perm=[0, 1, 3, 2])],
                    f"{scope}/self_attn")
    scores = w.node("Div", [scores, w.scalar(float(np.sqrt(hd)), f"{scope}/self_attn", np.float16)],
                    f"{scope}/self_attn")
    probs = w.node("Softmax", [w.node("Cast", [scores], f"{scope}/self_attn", to=T.FLOAT)], f"{scope}/self_attn",
                   axis=-1)
    probs = w.node("Cast", [probs], f"{scope}/self_attn", to=T.FLOAT16)
    ctx = w.node("Transpose", [w.node("MatMul", [probs, v], f"{scope}/self_attn")], f"{scope}/self_attn",
                 perm=[0, 2, 1, 3])
    ctx = _reshape_dynamic(w, ctx, y, [s.hidden], f"{scope}/self_attn")
    attn = w.node("MatMul", [ctx, w.weight(f"model.layers.{i}.self_attn.o_proj.weight", (s.hidden, s.hidden))],
                  f"{scope}/self_attn/o_proj")
    hidden = w.node("Add", [hidden, attn], scope)
    y = _rms_norm(w, hidden, w.weight(f"model.layers.{i}.post_attention_layernorm.weight", (s.hidden,), ones=True),
                  s.eps, f"{scope}/post_attention_layernorm", "")
    gate = w.node("MatMul", [y, w.weight(f"model.layers.{i}.mlp.gate_proj.weight", (s.hidden, s.intermediate))],
                  f"{scope}/mlp/gate_proj")
    act = w.node("Mul", [gate, w.node("Sigmoid", [gate], f"{scope}/mlp/act_fn")], f"{scope}/mlp/act_fn")
    up = w.node("MatMul", [y, w.weight(f"model.layers.{i}.mlp.up_proj.weight", (s.hidden, s.intermediate))],
                f"{scope}/mlp/up_proj")
    down = w.node("MatMul", [w.node("Mul", [act, up], f"{scope}/mlp"),
                             w.weight(f"model.layers.{i}.mlp.down_proj.weight", (s.intermediate, s.hidden))],
                  f"{scope}/mlp/down_proj")
    return w.node("Add", [hidden, down], scope)


def _rope_tables(w: _Writer, s: LlamaShape, seq: int) -> tuple[str, str]:
    """cos and sin [1, 1, seq, head_dim] as fp16 initializers, for a fixed sequence length."""
    inv = 1.0 / (10000 ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim))
    freqs = np.outer(np.arange(seq), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)[None, None]
    names = []
    for fn, name in ((np.cos, "rope_cos"), (np.sin, "rope_sin")):
        w.inits.append(numpy_helper.from_array(fn(emb).astype(np.float16), name))
        names.append(name)
    return names[0], names[1]


def write_llama(folder: Path, shape: LlamaShape, seq: int = 16, weights: str = "sparse", seed: int = 0) -> Path:
    """model.onnx (+ model.weights) in folder: input_ids [batch, seq] int64 → logits [batch, seq, vocab] fp16."""
    folder.mkdir(parents=True, exist_ok=True)
    w = _Writer(folder, weights, seed)
    half = shape.head_dim // 2
    starts = {"zero": w.ints([0], "slice_zero"), "half": w.ints([half], "slice_half"),
              "max": w.ints([2 ** 62], "slice_max"), "last": w.ints([-1], "slice_axis")}
    rope = _rope_tables(w, shape, seq)
    hidden = w.node("Gather", [w.weight("model.embed_tokens.weight", (shape.vocab, shape.hidden)), "input_ids"],
                    "/model/embed_tokens", axis=0)
    for i in range(shape.layers):
        hidden = _layer(w, i, hidden, shape, rope, starts)
    hidden = _rms_norm(w, hidden, w.weight("model.norm.weight", (shape.hidden,), ones=True), shape.eps, "/model/norm", "")
    logits = w.node("MatMul", [hidden, w.weight("lm_head.weight", (shape.hidden, shape.vocab))], "/lm_head")
    w.nodes.append(h.make_node("Identity", [logits], ["logits"], name="/output"))
    w.close()
    graph = h.make_graph(w.nodes, "llama", [h.make_tensor_value_info("input_ids", T.INT64, ["batch", seq])],
                         [h.make_tensor_value_info("logits", T.FLOAT16, ["batch", seq, shape.vocab])], w.inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path
