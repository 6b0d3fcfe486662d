"""The inputs a traced run feeds the graph: the user's .npz, or arrays synthesized from the input signature."""

from __future__ import annotations

import os

import numpy as np

from ..errors import InputError
from ..ir import Graph, Value
from .npz import read_npz

__all__ = ["load_inputs", "synthesize_inputs", "resolve_shape", "BATCH_DEFAULT", "DIM_DEFAULT"]

BATCH_DEFAULT = 1  # a symbolic dim whose name mentions "batch", or the first dim of an input
DIM_DEFAULT = 16  # every other symbolic or unknown dim (sequence length, ...)
_FLOAT = ("fp16", "bf16", "fp32", "fp64", "fp8-e4m3", "fp8-e5m2")
_NP_FLOAT = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}
_INDEX_PATH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def resolve_shape(value: Value, dims: dict[str, int]) -> tuple[int, ...]:
    """Concrete sizes for an input: fixed dims as stored, symbolic ones from --dim or the defaults."""
    shape = []
    for i, d in enumerate(value.shape or ()):
        if isinstance(d, int) and d > 0:
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            shape.append(dims[d])
        elif i == 0 or isinstance(d, str) and "batch" in d.lower():
            shape.append(BATCH_DEFAULT)
        else:
            shape.append(DIM_DEFAULT)
    return tuple(shape)


def _check_dim_names(graph: Graph, dims: dict[str, int]) -> None:
    """A --dim that names no symbolic dim of the inputs is a typo: say so rather than ignore it."""
    known = {d for v in graph.inputs for d in (v.shape or ()) if isinstance(d, str)}
    unknown = sorted(set(dims) - known)
    if unknown:
        names = ", ".join(sorted(known)) or "none: every input dim is fixed"
        raise InputError(graph.path, f"--dim {unknown[0]}: no input has a dim of that name (symbolic dims: {names})")


_MAX_ELEMENTS = 2**28  # 1 GiB of float32 per input: past that a synthesized batch is a mistake, not a test


def synthesize_inputs(graph: Graph, dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); integer ids below the size of the table they index; other integers 1 (an all-ones mask)."""
    rng = np.random.default_rng(seed)
    _check_dim_names(graph, dims)
    feeds = {}
    for value in graph.inputs:
        if value.shape is None:
            raise InputError(graph.path, f"input '{value.name}' has no shape in the model: give it with --inputs FILE.npz")
        shape = resolve_shape(value, dims)
        elements = int(np.prod(shape, dtype=np.float64))
        if elements > _MAX_ELEMENTS:
            raise InputError(graph.path, f"input '{value.name}' would have shape {tuple(shape)} ({elements:.3g} values): "
                                         "too large to synthesize; give smaller --dim sizes or your own --inputs FILE.npz")
        if value.dtype in _FLOAT:
            feeds[value.name] = rng.standard_normal(shape).astype(_NP_FLOAT.get(value.dtype, np.float32))
        elif value.dtype == "bool":
            feeds[value.name] = np.ones(shape, dtype=bool)
        else:
            table = _table_size(value)
            dtype = np.dtype(value.dtype or "int64")
            feeds[value.name] = (rng.integers(0, table, shape) if table else np.ones(shape)).astype(dtype)
    return feeds


def _table_size(value: Value) -> int | None:
    """The number of rows of the embedding table an integer input indexes (through Casts and reshapes), if any."""
    frontier, seen = [value], 0
    sizes = []
    while frontier and seen < 64:
        current = frontier.pop()
        seen += 1
        for user in current.consumers:
            if user.op_type == "Gather" and user.input(1) is current and user.input(0) is not None:
                table = user.inputs[0]
                axis = int(user.attr("axis", 0))
                if table.shape and isinstance(table.shape[axis], int):
                    sizes.append(table.shape[axis])
            elif user.op_type in _INDEX_PATH and user.input(0) is current:
                frontier.extend(user.outputs)
    return min(sizes) if sizes else None


def load_inputs(graph: Graph, path: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """One array per graph input, checked against the input's rank, fixed dims and kind (float / integer)."""
    if not os.path.lexists(path):
        raise InputError(path, "no such inputs file (--inputs expects an .npz with one array per graph input)")
    arrays = read_npz(path)
    names = [v.name for v in graph.inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(path, f"no array for graph input '{missing[0]}' (the file has: {', '.join(sorted(arrays)) or 'nothing'}; "
                               f"the model's inputs are: {', '.join(names)})")
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise InputError(path, f"array '{extra[0]}' matches no graph input (the model's inputs are: {', '.join(names)})")
    for value in graph.inputs:
        arrays[value.name] = _checked(value, arrays[value.name], path)
    return arrays


def _checked(value: Value, array: np.ndarray, path: str) -> np.ndarray:
    if value.shape is not None:
        if array.ndim != len(value.shape):
            raise InputError(path, f"input '{value.name}': array has shape {array.shape}, the model expects rank "
                                   f"{len(value.shape)} ({_shape_text(value.shape)})")
        for i, (got, want) in enumerate(zip(array.shape, value.shape)):
            if isinstance(want, int) and want > 0 and got != want:
                raise InputError(path, f"input '{value.name}': dim {i} is {got}, the model expects {want} "
                                       f"({_shape_text(value.shape)})")
    is_float = value.dtype in _FLOAT
    if is_float and array.dtype.kind not in "fiu" or not is_float and array.dtype.kind not in "iub":
        raise InputError(path, f"input '{value.name}': array of {array.dtype} where the model expects {value.dtype}")
    if is_float:  # numpy.savez writes float64 by default: the model's input dtype is what it runs on
        want = _NP_FLOAT.get(value.dtype)
        return array.astype(want) if want is not None else array.astype(np.float32) if array.dtype.kind != "f" else array
    return array.astype(np.dtype(value.dtype)) if value.dtype and value.dtype != "bool" else array


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"
