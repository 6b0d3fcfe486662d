"""Which decomposed LayerNorms a runtime's graph optimizer fuses into one kernel: the chain onnxruntime's
LayerNormFusion matches (core/optimizer/layer_norm_fusion.cc), found from the graph's structure alone.

x → ReduceMean → Sub(x, mean) = d → Pow(d, 2) or Mul(d, d) → ReduceMean → Add(·, eps) → Sqrt → Div(d, ·), with
optional Casts between, as the TorchScript exporter and most hand-written LayerNorms are exported.
"""

from __future__ import annotations

from ..analysis.constants import resolve_scalar
from ..ir import Graph, Node, Value

__all__ = ["layer_norm_chains"]


def layer_norm_chains(graph: Graph) -> list[list[Node]]:
    """Every matched chain, its nodes in graph order (the two ReduceMeans, Sub, the square, Add, Sqrt, Div)."""
    chains = []
    for div in graph.by_op("Div"):
        chain = _match(div)
        if chain is not None:
            order = {id(n): i for i, n in enumerate(chain)}
            chains.append(sorted(chain, key=lambda n: order[id(n)]))
    return chains


def _through_casts(value: Value | None) -> Node | None:
    node = value.producer if value is not None else None
    while node is not None and node.op_type == "Cast":
        node = node.inputs[0].producer if node.inputs and node.inputs[0] is not None else None
    return node


def _match(div: Node) -> list[Node] | None:
    if len(div.inputs) != 2 or div.inputs[0] is None:
        return None
    sub, sqrt = _through_casts(div.inputs[0]), _through_casts(div.inputs[1])
    if sub is None or sub.op_type != "Sub" or sqrt is None or sqrt.op_type != "Sqrt":
        return None
    add = _through_casts(sqrt.inputs[0])
    if add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    eps = [v for v in add.inputs if resolve_scalar(v) is not None]
    rest = [v for v in add.inputs if resolve_scalar(v) is None]
    if len(eps) != 1 or len(rest) != 1:
        return None
    var = _through_casts(rest[0])
    if var is None or var.op_type != "ReduceMean":
        return None
    square = _through_casts(var.inputs[0])
    if square is None or not _squares(square, sub):
        return None
    mean = _through_casts(sub.inputs[1]) if len(sub.inputs) == 2 else None
    if mean is None or mean.op_type != "ReduceMean" or mean.inputs[0] is not sub.inputs[0]:
        return None
    return [mean, sub, square, var, add, sqrt, div]


def _squares(node: Node, sub: Node) -> bool:
    """Pow(d, 2) or Mul(d, d) of the centred value d = Sub's output."""
    d = sub.outputs[0]
    if node.op_type == "Pow" and len(node.inputs) == 2 and _through_casts(node.inputs[0]) is sub:
        exponent = resolve_scalar(node.inputs[1])
        return exponent is not None and exponent.value == 2
    if node.op_type == "Mul" and len(node.inputs) == 2:
        return all(v is d or _through_casts(v) is sub for v in node.inputs)
    return False
