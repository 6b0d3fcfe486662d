"""Build examples/tiny_block_fp16.onnx: a small fp16 block with the hazards precaudit exists to find.

Run `python examples/make_example.py` to regenerate it; the file is committed so the README's first
command works without building anything.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

F16 = np.float16


def c(name, value, dtype=F16):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def build() -> onnx.ModelProto:
    nodes, inits = [], [c("two", 2.0), c("rms_eps", 1e-6), c("ln_scale", np.ones(16))]
    # 1. A fused LayerNormalization with BERT's eps 1e-12: stash_type defaults to float32, so this is safe.
    nodes.append(h.make_node("LayerNormalization", ["x", "ln_scale"], ["h0"], name="/embeddings/LayerNorm/LayerNormalization",
                             epsilon=1e-12))
    # 2. A decomposed LayerNorm whose eps is an fp32 Constant cast to fp16: 1e-12 becomes 0.0.
    nodes += [
        h.make_node("ReduceMean", ["h0"], ["m"], name="/attn_norm/ReduceMean", axes=[-1]),
        h.make_node("Sub", ["h0", "m"], ["d"], name="/attn_norm/Sub"),
        h.make_node("Pow", ["d", "two"], ["d2"], name="/attn_norm/Pow"),
        h.make_node("ReduceMean", ["d2"], ["v"], name="/attn_norm/ReduceMean_1", axes=[-1]),
        h.make_node("Constant", [], ["eps32"], name="/attn_norm/Constant", value=c("e", 1e-12, np.float32)),
        h.make_node("Cast", ["eps32"], ["eps16"], name="/attn_norm/Cast", to=T.FLOAT16),
        h.make_node("Add", ["v", "eps16"], ["ve"], name="/attn_norm/Add"),
        h.make_node("Sqrt", ["ve"], ["s"], name="/attn_norm/Sqrt"),
        h.make_node("Div", ["d", "s"], ["h1"], name="/attn_norm/Div"),
    ]
    # 3. Attention probabilities, then Log of the Softmax instead of LogSoftmax.
    nodes += [
        h.make_node("Softmax", ["h1"], ["p"], name="/attn/Softmax", axis=-1),
        h.make_node("Log", ["p"], ["logp"], name="/attn/Log"),
    ]
    # 4. An RMSNorm computed in fp16 without the float32 upcast: eps 1e-6 is subnormal.
    nodes += [
        h.make_node("Pow", ["logp", "two"], ["sq"], name="/mlp_norm/Pow"),
        h.make_node("ReduceMean", ["sq"], ["ms"], name="/mlp_norm/ReduceMean", axes=[-1]),
        h.make_node("Add", ["ms", "rms_eps"], ["mse"], name="/mlp_norm/Add"),
        h.make_node("Sqrt", ["mse"], ["rms"], name="/mlp_norm/Sqrt"),
        h.make_node("Div", ["logp", "rms"], ["h2"], name="/mlp_norm/Div"),
    ]
    # 5. An L2 normalization with no eps at all.
    nodes.append(h.make_node("LpNormalization", ["h2"], ["y"], name="/head/LpNormalization", axis=-1, p=2))
    x = h.make_tensor_value_info("x", T.FLOAT16, ["batch", "seq", 16])
    y = h.make_tensor_value_info("y", T.FLOAT16, ["batch", "seq", 16])
    graph = h.make_graph(nodes, "tiny_block", [x], [y], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="precaudit-example")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "tiny_block_fp16.onnx"
    onnx.save(build(), str(out))
    print(f"wrote {out}")
