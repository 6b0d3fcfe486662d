"""Models the report tests render: a T5-shaped stack of decomposed RMSNorms with TorchScript-style node names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper as h

from fixtures.onnx_builders import const, model, save, tensor

__all__ = ["t5_like"]


def t5_like(path: Path, blocks: int = 24, eps: float = 1e-6, growth: float = 1.0, prefix: str = "/encoder",
            hidden: int = 16) -> Path:
    """blocks × 2 pre-norm residual layers (RMSNorm written out: Pow, ReduceMean, Add eps, Sqrt, Div, Mul weight;
    then MatMul and the residual Add), then a final norm; float32, named as the TorchScript exporter names them.

    With growth > 1 each layer also scales the stream by it (a Mul before the residual Add), so the activations
    climb layer by layer: 1.3 overflows float16 a few layers before the end of 24 blocks.
    """
    nodes, inits = [], [const("two", 2.0), const("eps", eps), const("w", np.ones(hidden)),
                        const("proj", np.eye(hidden) * 0.5), const("growth", growth)]
    x = "x"
    for b in range(blocks):
        for layer in range(2):
            p = f"{prefix}/block.{b}/layer.{layer}"
            normed = _rms_norm(nodes, x, f"{p}/layer_norm")
            nodes.append(h.make_node("MatMul", [normed, "proj"], [f"{p}/mm"], name=f"{p}/MatMul"))
            if growth != 1.0:
                nodes.append(h.make_node("Mul", [x, "growth"], [f"{p}/grown"], name=f"{p}/Mul"))
                x = f"{p}/grown"
            nodes.append(h.make_node("Add", [x, f"{p}/mm"], [f"{p}/out"], name=f"{p}/Add"))
            x = f"{p}/out"
    y = _rms_norm(nodes, x, f"{prefix}/final_layer_norm")
    nodes.append(h.make_node("Identity", [y], ["y"], name="output"))
    shape = (2, 4, hidden)
    return save(model(nodes, [tensor("x", "fp32", shape)], [tensor("y", "fp32", shape)], inits, opset=17), path)


def _rms_norm(nodes: list, x: str, p: str) -> str:
    nodes += [
        h.make_node("Pow", [x, "two"], [f"{p}/sq"], name=f"{p}/Pow"),
        h.make_node("ReduceMean", [f"{p}/sq"], [f"{p}/var"], name=f"{p}/ReduceMean", axes=[-1]),
        h.make_node("Add", [f"{p}/var", "eps"], [f"{p}/ve"], name=f"{p}/Add"),
        h.make_node("Sqrt", [f"{p}/ve"], [f"{p}/std"], name=f"{p}/Sqrt"),
        h.make_node("Div", [x, f"{p}/std"], [f"{p}/n"], name=f"{p}/Div"),
        h.make_node("Mul", [f"{p}/n", "w"], [f"{p}/y"], name=f"{p}/Mul"),
    ]
    return f"{p}/y"
