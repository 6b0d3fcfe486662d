"""Find the scalar constant behind a value, wherever an exporter put it, and say where it came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import format_of_onnx_type
from ..ir import UNKNOWN, Node, Value, shown_origin

__all__ = ["ScalarConst", "is_constant", "producer_through_casts", "resolve_fill", "resolve_scalar", "skip_casts"]

# Ops that pass a scalar through unchanged in value (a Cast changes only its dtype; rounding comes later).
_PASS_THROUGH = {"Cast", "CastLike", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Flatten"}
_MAX_ELEMENTS = 64  # read constants up to this size: eps vectors are tiny, weights are never read


@dataclass(frozen=True)
class ScalarConst:
    """A constant's value as written and the path from where it lives to where it is used."""

    value: float
    source: str  # "Constant node 'c' → Cast to float16 at 'cast_1'"


def resolve_scalar(value: Value | None) -> ScalarConst | None:
    """The single value a (possibly cast, expanded or reshaped) constant holds, or None.

    Worked out once per value (rules, signs, norms and constant sites all ask about the same eps and scales).
    """
    if value is None:
        return None
    found = value._scalar
    if found is UNKNOWN:
        if value.const_loader is None and (value.producer is None or value.producer.op_type not in _PASS_THROUGH):
            found = None  # an activation: no constant behind it
        else:
            found = _resolve_scalar(value)
        value._scalar = found
    return found


def _resolve_scalar(value: Value | None) -> ScalarConst | None:
    value, hops = _through_moves(value)
    if value is None or not value.is_const:
        return None
    if value.const_size is not None and value.const_size > _MAX_ELEMENTS:
        return None
    data = value.const()
    if data is None or data.size == 0 or (data.dtype.kind not in "fiu" and data.dtype.kind != "V"):
        return None
    flat = np.asarray(data, dtype=np.float64).ravel()
    first = flat[0]
    if np.isnan(first) if flat.size == 1 else not np.all(flat == first):
        return None  # a vector of different values is not one eps (nor is NaN, which equals nothing)
    return ScalarConst(float(flat[0]), _source(value, hops))


def _through_moves(value: Value | None) -> tuple[Value | None, list[str]]:
    """The value behind a chain of Casts, Expands, Reshapes..., and the hops worth naming (last first)."""
    hops: list[str] = []
    seen = 0
    while value is not None and not value.is_const and value.producer is not None and seen < 8:
        node = value.producer
        if node.op_type not in _PASS_THROUGH:
            return None, hops
        if node.op_type in ("Cast", "CastLike"):
            fmt = format_of_onnx_type(node.attr("to", 0)) if node.op_type == "Cast" else None
            hops.append(f"Cast to {fmt.long_name if fmt else 'another type'} at '{node.name}'")
        elif node.op_type == "Expand":
            hops.append(f"Expand at '{node.name}'")
        value = node.input(0)
        seen += 1
    return value, hops


def _source(value: Value, hops: list[str]) -> str:
    # as messages name it: an unnamed Constant node by the tensor it makes, not by precaudit's generated name
    return " → ".join([shown_origin(value), *reversed(hops)])


_MAX_FILL_ELEMENTS = 1 << 22  # a folded attention mask of up to 2048 x 2048 positions (16 MB in float32)


def resolve_fill(value: Value | None) -> ScalarConst | None:
    """The fill value of a constant mask tensor, as a scalar constant: a float constant of more than one value that
    holds 0 and one other number only. The dynamo exporter folds a causal mask into such an initializer (0 where a
    position is attended, finfo(float32).min elsewhere); TorchScript writes the same fill as a scalar in a Where.

    Only asked of constants that reach a Softmax (a mask's use); worked out once per value (constant sites ask at
    each reader, weight sites and fix again), the tensor read afresh and not kept (Value.const would keep it).
    """
    if value is None:
        return None
    found = value._fill
    if found is UNKNOWN:
        found = value._fill = _resolve_fill(value)
    return found


def _resolve_fill(value: Value | None) -> ScalarConst | None:
    value, hops = _through_moves(value)
    if value is None or not value.is_const or value.dtype not in ("fp16", "bf16", "fp32", "fp64"):
        return None
    if value.const_size is None or not 1 < value.const_size <= _MAX_FILL_ELEMENTS:
        return None
    loader = value.const_loader
    assert loader is not None  # is_const, checked above
    data = value._const_cache if value._const_cache is not None else loader()
    if data is None or data.dtype.kind != "f":
        return None
    flat = data.reshape(-1)
    fills = flat[flat != 0]
    if fills.size in (0, flat.size) or not np.all(fills == fills[0]):
        return None  # all zeros, no zero at all (a weight), or more than one other number (NaN equals nothing)
    return ScalarConst(float(fills[0]), f"{_source(value, hops)}, a mask of {flat.size} values, 0 or the fill")


def is_constant(value: Value | None) -> bool:
    """A constant, or a constant passed through Cast/Expand/Reshape/...: data fixed in the file, not activations."""
    if value is None:
        return False
    found = value._constant
    if found is UNKNOWN:
        found = value._constant = _is_constant(value)
    return found


def _is_constant(value: Value | None) -> bool:
    for _ in range(8):
        if value is None:
            return False
        if value.is_const:
            return True
        if value.producer is None or value.producer.op_type not in _PASS_THROUGH:
            return False
        value = value.producer.input(0)
    return False


_CASTS = {"Cast", "Identity"}


def skip_casts(value: Value | None) -> Value | None:
    """The value a chain of Casts and Identities started from: what the data is, whatever dtype it moved in."""
    while value is not None and value.producer is not None and value.producer.op_type in _CASTS:
        value = value.producer.input(0)
    return value


def producer_through_casts(value: Value | None) -> Node | None:
    """The node that made a value, looking through Casts and Identities; None at the graph's edge."""
    value = skip_casts(value)
    return value.producer if value is not None else None
