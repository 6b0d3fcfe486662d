"""integer_float sites: the node that makes a float carry integers (a float Range, a CumSum of ones, a Cast of
integers), and how large they can get against the largest integer the format holds exactly."""

from __future__ import annotations

from ...dtypes import FORMATS
from ...ir import Node
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..integers import compared_by, integer_source
from .base import Site
from .facts import dtype_facts

__all__ = ["integer_site", "sized_by"]


def sized_by(dims: tuple[str, ...]) -> str:
    """' (with --dim seq=4096)' where a bound rests on the user's sizes, else nothing."""
    return f" (with --dim {', '.join(dims)})" if dims else ""


def integer_site(node: Node, resolver: DtypeResolver) -> Site | None:
    """The node that makes a float carry integers (a float Range, a CumSum of ones, a Cast of integers)."""
    if not node.outputs or node.outputs[0].dtype not in FORMATS:
        return None
    source = integer_source(node.outputs[0], resolver.graph.dim_sizes)
    if source is None or source.node is not node:
        return None
    dtype = resolver.of_value(node.outputs[0])
    if dtype is None:
        return None
    made_in = resolver.of_node(node)
    if made_in is not None and made_in.fmt.ulp_at_1 < dtype.fmt.ulp_at_1:
        # a converter's block list keeps a Range or CumSum in float32 and casts its output back for its readers: the
        # integers are exact where made and rounded where read
        dtype = ComputeDtype(dtype.fmt, f"'{node.name}' computes in {made_in.fmt.long_name} ({made_in.reason}), "
                                        f"and its output is cast to {dtype.fmt.long_name} for its readers")
    # positions the graph counts (a Range, a CumSum of ones) that a comparison reads build a mask (a causal mask's
    # i > j): where neighbours merge the mask is wrong, whatever their bound; an integer input's values (0 and 1
    # of an attention mask) are the user's
    counts = source.kind.endswith(("Range", "CumSum of ones"))
    compared = compared_by(node) if counts else None
    if source.bound is not None:
        text = f"up to {source.bound:.0f}{sized_by(source.sized_by)}"
    else:
        text = f"with no bound the graph fixes (they follow {source.open or 'values the graph does not bound'})"
    facts = {"op": node.op_type, "integer_from": source.kind, "int_bound": source.bound, "int_bound_text": text,
             "bound_from": sized_by(source.sized_by),
             "compared_by": f"{compared.op_type} '{compared.name}'" if compared is not None else None,
             "mask_note": f"; {compared.op_type} '{compared.name}' compares them, so a mask built from them is "
                          f"wrong where they merge" if compared is not None else "",
             # every integer up to 2**(mantissa bits + 1) is exact: float16 2048, bfloat16 256
             "exact_limit": 2 / dtype.fmt.ulp_at_1, **dtype_facts(dtype, resolver)}
    return Site("integer_float", node, facts)
