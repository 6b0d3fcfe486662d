"""Whether a model is already stored in the target format (so its float16 constants are read, not converted)."""

from __future__ import annotations

from ..dtypes import Format, format_of_onnx_type
from ..ir import Graph, Value

__all__ = ["stored_in_target"]

# ops that move or retype data without computing on it: one of them on a float16 value (an fp32 model's output cast
# to float16 and passed on) says nothing about where the model computes
_MOVES = frozenset({"Cast", "CastLike", "Constant", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze",
                    "Transpose", "Flatten", "Slice", "Gather", "Concat", "Split"})


def stored_in_target(graph: Graph, target: Format) -> bool:
    """Whether the model is already stored in the target format: a float input in it, a node computing on an
    activation and a constant stored in it, or most of its weights.

    (Token-id models have no float input, so the weights decide; an fp32 model with one fp16 output does not
    count as converted, nor does one that casts an activation to fp16 and back, nor one that stores its weights
    in fp16 and casts each to float32 before use (compressed, not converted: it computes in float32). A converter's model with its inputs
    kept float32, keep_io_types=True, and most weights read by kept nodes, has neither: the nodes it converted
    compute on activations and constants it stored in the target format.)
    """
    if any(v.dtype == target.name for v in graph.inputs):
        return True
    for node in graph.nodes:
        if node.op_type in _MOVES:
            continue
        reads = [v for v in node.inputs if v is not None and v.dtype == target.name]
        if any(v.is_const for v in reads) and any(not v.is_const for v in reads):
            return True
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None and v.const_loader is not None and v.producer is None and id(v) not in seen:
                seen.add(id(v))
                dtype = _decompressed(v) or v.dtype or ""
                sizes[dtype] = sizes.get(dtype, 0) + (v.const_size or 1)
    return sizes.get(target.name, 0) > sizes.get("fp32", 0)


def _decompressed(weight: Value) -> str | None:
    """The float a weight is cast to before any use, where every reader is a Cast to one (OpenVINO's
    compress_to_fp16 stores float32 weights so, each float16 constant read by a Convert to float32): the model
    computes in that float, and the weight counts as one of its. None otherwise."""
    to = {format_of_onnx_type(reader.attr("to", 0)) if reader.op_type == "Cast" else None for reader in weight.consumers}
    if len(to) != 1:
        return None
    (fmt,) = to
    return fmt.name if fmt is not None and fmt.name != weight.dtype else None
