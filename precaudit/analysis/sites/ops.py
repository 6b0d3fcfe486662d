"""Single-op sites: a Softmax, LogSoftmax, Log, Sqrt, Reciprocal, Div, Exp or Pow, with what it reads."""

from __future__ import annotations

from typing import Any

from ...ir import Node
from ..compute_dtype import DtypeResolver
from ..signs import SignAnalysis
from .base import Site
from .facts import dtype_facts
from .walks import feeding_op, scalar_of, selected_by_where_only

__all__ = ["op_site"]


def op_site(node: Node, resolver: DtypeResolver, signs: SignAnalysis) -> Site | None:
    dtype = resolver.of_node(node)
    if dtype is None:
        return None
    facts: dict[str, Any] = {"op": node.op_type, "input_op": feeding_op(node.input(0)),
                             "input_class": signs.of(node.input(0)), "in_norm_chain": False,
                             "selected_by_where": selected_by_where_only(node),
                             **dtype_facts(dtype, resolver)}
    if node.op_type in ("Div", "Reciprocal"):
        divisor = node.input(1 if node.op_type == "Div" else 0)
        facts["divisor_op"] = feeding_op(divisor)
        facts["divisor_class"] = signs.of(divisor)
        facts["divisor_mask"] = signs.mask_origin(divisor)
    if node.op_type == "Pow":
        facts["exponent"] = scalar_of(node.input(1))
    if node.op_type in ("Softmax", "LogSoftmax"):
        facts["axis"] = node.attr("axis", -1 if (node.opset or 13) >= 13 else 1)
    return Site(node.op_type.lower(), node, facts)
