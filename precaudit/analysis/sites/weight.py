"""Weight sites: float32 weights (initializers, Constant tensors) measured against the dtype a conversion gives
them, as the converter modelled leaves them (its clamp) and rounded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ...converters import Clamp
from ...dtypes import Format, format_of_onnx_type
from ...errors import MissingFile
from ...ir import Graph, Node, Value, shown_node, shown_origin
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..constants import resolve_fill, resolve_scalar
from ..fused_norms import FUSED_NORMS
from .base import Site
from .blocks import find_block_weight_sites
from .facts import dtype_facts
from .norm import MAX_CHANNELS
from .walks import feeds_softmax

__all__ = ["find_weight_sites", "weight_stats"]


_WEIGHT_CHUNK = 1 << 20  # elements measured at a time: the temporaries stay at a few MB, whatever the tensor

def find_weight_sites(graph: Graph, resolver: DtypeResolver, norm_params_only: bool = False) -> list[Site]:
    """A site for every float32 weight (initializer or Constant tensor) that a conversion would change the dtype of.

    Reads the tensors one at a time and keeps only their numbers, so memory stays bounded by the largest one.
    A tensor is converted to the narrowest dtype any of its readers computes in (a Cast reader: the dtype it casts
    to); one read only by --keep-fp32 nodes, or by float32 islands, stays float32 and is skipped. Single-valued
    constants are the constant sites' (PA209). Weights a block-scaled format quantizes come as block_weight sites
    (blocks.py). norm_params_only: only the fused normalizations' parameters, up to MAX_CHANNELS values each (what
    the static audit reads).
    """
    sites, seen = [], set()
    for node in graph.nodes:
        for value in _norm_params(node) if norm_params_only else node.inputs:
            if value is None or id(value) in seen or not value.is_const or value.dtype != "fp32":
                continue
            seen.add(id(value))
            try:
                site = _site_of(value, resolver)
            except MissingFile:
                # the static audit of a graph whose weights were never downloaded still runs: it reads a norm's
                # parameters where they are there (--check-weights and --trace need every weight)
                if norm_params_only:
                    continue
                raise
            if site is not None:
                sites.append(site)
    return sites if norm_params_only else sites + find_block_weight_sites(graph, resolver, _weight_data)


def _site_of(value: Value, resolver: DtypeResolver) -> Site | None:
    converted = _converted_by(value, resolver)
    if converted is None or resolve_scalar(value) is not None or _mask_fill(value):
        return None
    return _weight_site(value, *converted, resolver)


def _norm_params(node: Node) -> list[Value | None]:
    """A fused norm's parameter inputs (fused_norms.py: one number per channel), MAX_CHANNELS values at most each:
    the static audit reads them where it reads no other weight (a running variance beyond 65504 breaks a float16
    model as surely as any weight does)."""
    roles = _roles(node)
    return [v for i, v in enumerate(node.inputs) if i in roles and v is not None and (v.const_size or 0) <= MAX_CHANNELS]


def _roles(node: Node) -> dict[int, str]:
    spec = FUSED_NORMS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
    return dict(spec.params) if spec is not None else {}


def _weight_site(value: Value, dtype: ComputeDtype, reader: Node, resolver: DtypeResolver) -> Site | None:
    data = _weight_data(value)
    if data is None or data.dtype.kind != "f":
        return None
    clamp = dtype.clamp if dtype.clamp is not None and dtype.clamp.applies_to(value.const_origin or "") else None
    stats = weight_stats(data, dtype.fmt, clamp)
    del data  # before the next tensor is read
    role = _role(value, reader)
    facts = {"op": reader.op_type, "name": value.name, "source": shown_origin(value), "consumer": reader.name,
             "role": role, "read_as": f"{'the ' + role + ' ' if role else ''}read by {shown_node(reader)}",
             "converted_by": clamp.by if clamp is not None and (stats["overflow_count"] or stats["raised_count"])
             else "", **_overflow_effect(dtype.fmt, clamp, stats["absmax"]), "block_note": _block_note(value),
             **stats, **dtype_facts(dtype, resolver)}
    return Site("weight", reader, facts)


def _role(value: Value, reader: Node) -> str:
    """What the reader takes the value as, where it is a normalization's parameter ("running variance")."""
    roles = _roles(reader)
    return next((roles[i] for i, v in enumerate(reader.inputs) if v is value and i in roles), "")


def _overflow_effect(fmt: Format, clamp: Clamp | None, absmax: float) -> dict[str, Any]:
    """Beyond which |w| the conversion changes a weight past rounding (overflow_limit, named by limit_name), and what
    it makes of such values: rounding makes them inf, a converter's clamp lowers them to its max_finite."""
    if clamp is None:
        return {"overflow_limit": fmt.max, "limit_name": f"the {fmt.long_name} max",
                "overflow_effect": f"converted to {fmt.long_name} they become inf (NaN in formats without inf)"}
    return {"overflow_limit": clamp.max_finite,
            "limit_name": f"the {fmt.long_name} max" if clamp.max_finite == fmt.max else "the converter's max_finite_val",
            "overflow_effect": f"{clamp.by} clamps them to ±{clamp.max_finite:.6g}, the largest to "
                               f"1/{absmax / clamp.max_finite:.4g} of itself"}


def _block_note(value: Value) -> str:
    """What else a converter's block list needs for the reader of this weight to read it in float32.

    onnxruntime's converter and onnxconverter-common keep an initializer that only blocked nodes read, but convert
    a Constant node (its tensor is then rounded and clamped, and cast back for a blocked reader) unless the Constant
    node itself is blocked."""
    maker = value.producer
    if maker is None or maker.op_type != "Constant":
        return ("; onnxruntime's converter and onnxconverter-common keep an initializer that only blocked nodes read "
                "in float32")
    named = (f"'{maker.name}', precaudit's name for {shown_node(maker)}: name it first, as precaudit keep-list's "
             "snippet does" if maker.unnamed else f"'{maker.name}'")
    return ("; blocking the reader is not enough here: the weight is a Constant node's, which onnxruntime's converter "
            f"and onnxconverter-common convert even when every reader is blocked: block that node too ({named}), or "
            "add 'Constant' to op_block_list")


def _mask_fill(value: Value) -> bool:
    """A 0-or-fill mask tensor that reaches a Softmax: the constant sites' (PA209, PA215), as a scalar fill is."""
    return any(feeds_softmax(reader) for reader in value.consumers) and resolve_fill(value) is not None


def _converted_by(value: Value, resolver: DtypeResolver) -> tuple[ComputeDtype, Node] | None:
    """The narrowest dtype a reader of the value computes in, and that reader; None when every reader keeps float32."""
    best = None
    for reader in value.consumers:
        if reader.op_type == "Cast":
            fmt = format_of_onnx_type(reader.attr("to", 0))
            dtype = ComputeDtype(fmt, f"Cast to {fmt.long_name} at node '{reader.name}'") if fmt is not None else None
        else:
            dtype = resolver.of_node(reader)
        if dtype is None or dtype.fmt.wide:
            continue
        if best is None or _narrowness(dtype.fmt) < _narrowness(best[0].fmt):
            best = (dtype, reader)
    return best


def _narrowness(fmt: Format) -> tuple[float, float]:
    return fmt.max, -fmt.ulp_at_1


def _weight_data(value: Value) -> np.ndarray | None:
    """The tensor's data: the copy traced mode already loaded, else read afresh and not kept (Value.const() would
    cache every weight of the model)."""
    cached = value._const_cache
    if cached is not None:
        return cached
    assert value.const_loader is not None  # asked only of constants
    return value.const_loader()


def weight_stats(data: np.ndarray, fmt: Format, clamp: Clamp | None = None) -> dict[str, Any]:
    """What converting a float array into fmt does to it, measured a chunk at a time: clamped first where a
    converter clamps it (clamp), then rounded.

    Round to nearest even: |w| up to half the smallest subnormal becomes 0 (the tie goes to the even 0), |w| below
    the smallest normal less half a subnormal step becomes subnormal, a finite |w| from max + half an ulp becomes
    inf (NaN in formats without inf). ±inf and NaN are already what they are (a mask table's -inf row): no
    overflow, and not the largest |w| either, except that a format without inf (float8_e4m3fn) makes inf NaN.
    A clamp raises 0 < |w| < min_positive to min_positive (raised_count) and lowers |w| > max_finite to max_finite:
    overflow_count then counts the values it lowers to something other than their own rounding.

    A value that becomes 0 is lost (lost_count) only when it is at least negligible_below = largest |w| times the
    format's unit roundoff (2⁻¹¹ in float16): a smaller one changes any sum it enters by less than rounding the
    largest term of that sum already does.
    """
    zero_up_to = fmt.smallest_subnormal / 2
    normal_from = fmt.smallest_normal - fmt.smallest_subnormal / 2
    flat = data.reshape(-1)
    absmax, nonzero, overflow, underflow, subnormal, raised = 0.0, 0, 0, 0, 0, 0
    for chunk, infinite in _abs_chunks(flat):
        if not fmt.has_inf:
            overflow += infinite
        nonzero += int(np.count_nonzero(chunk > 0))
        absmax = max(absmax, float(chunk.max(initial=0.0)))
        a = chunk
        if clamp is not None:
            a, up, down = _clamped(chunk, clamp, fmt)
            raised, overflow = raised + up, overflow + down
        else:
            overflow += int(np.count_nonzero(a >= fmt.overflow_threshold))
        tiny = a <= zero_up_to
        underflow += int(np.count_nonzero(tiny)) - int(np.count_nonzero(a == 0))
        subnormal += int(np.count_nonzero(a < normal_from)) - int(np.count_nonzero(tiny))
    negligible_below = absmax * fmt.ulp_at_1 / 2
    lost = _lost(flat, zero_up_to, negligible_below, clamp, fmt) if underflow else 0
    return {"elements": int(flat.size), "nonzero": nonzero, "absmax": absmax, "overflow_count": overflow,
            "underflow_count": underflow, "underflow_fraction": _share(underflow, nonzero), "lost_count": lost,
            "lost_fraction": _share(lost, nonzero), "negligible_below": negligible_below, "raised_count": raised,
            "subnormal_fraction": _share(subnormal, nonzero)}


def _share(count: int, nonzero: int) -> float:
    return count / nonzero if nonzero else 0.0


def _abs_chunks(flat: np.ndarray) -> Iterator[tuple[np.ndarray, int]]:
    """|w| a chunk at a time, in float64, ±inf and NaN as 0; with the number of ±inf in the chunk."""
    for start in range(0, flat.size, _WEIGHT_CHUNK):
        a = np.abs(flat[start:start + _WEIGHT_CHUNK], dtype=np.float64)
        if np.isfinite(a).all():
            yield a, 0
        else:
            yield np.where(np.isfinite(a), a, 0.0), int(np.count_nonzero(np.isinf(a)))


def _clamped(a: np.ndarray, clamp: Clamp, fmt: Format) -> tuple[np.ndarray, int, int]:
    """|w| (finite) as the clamp leaves them; how many it raised; how many it lowered to other than their rounding."""
    up = (a > 0) & (a < clamp.min_positive)
    down = a > clamp.max_finite
    lowered = 0
    if down.any():
        with np.errstate(over="ignore"):  # beyond the format's range: inf, which is no ceiling's rounding
            ceiling = np.asarray(clamp.max_finite).astype(fmt.np_dtype)
            lowered = int(np.count_nonzero(a[down].astype(fmt.np_dtype) != ceiling))
    a = np.where(up, clamp.min_positive, np.where(down, clamp.max_finite, a))
    return a, int(np.count_nonzero(up)), lowered


def _lost(flat: np.ndarray, zero_up_to: float, negligible_below: float, clamp: Clamp | None, fmt: Format) -> int:
    """How many values become 0 and are not negligible (a second pass: the largest |w| was not known in the first)."""
    lost = 0
    for chunk, _ in _abs_chunks(flat):
        a = _clamped(chunk, clamp, fmt)[0] if clamp is not None else chunk
        lost += int(np.count_nonzero((a > 0) & (a <= zero_up_to) & (a >= negligible_below)))
    return lost
