"""The inputs a traced run feeds the graph: the user's .npz, or arrays synthesized from the input signature, and
a record of which (a number measured on synthesized inputs says nothing about the user's data)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..dims import check_dim_names, dim_key
from ..dtypes import COMPUTED
from ..errors import InputError
from ..ir import Graph, Value
from ..options import TraceOptions
from .npz import read_npz

__all__ = [
    "BATCH_DEFAULT",
    "DIM_DEFAULT",
    "MASK_ROWS",
    "InputSource",
    "input_batches",
    "is_mask",
    "iter_batches",
    "load_inputs",
    "resolve_shape",
    "synthesize_inputs",
]

BATCH_DEFAULT = 1  # a symbolic dim whose name mentions "batch", or the first dim of an input
DIM_DEFAULT = 16  # every other symbolic or unknown dim (sequence length, ...)
_FLOAT = COMPUTED
_NP_FLOAT = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}
_INDEX_PATH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


# A mask is synthesized row by row in the states real inputs have: all valid, and partly valid (the second half
# masked). Never all masked: a row with no valid position makes a softmax over nothing, NaN in float32 too, which
# real inputs never feed (a failure of the synthesized input's making). Two rows need a batch of two: a symbolic
# batch dim of a model with a mask input is guessed as 2.
MASK_ROWS = 2
_MASK_NAME = re.compile(r"mask|padding", re.IGNORECASE)


def is_mask(value: Value) -> bool:
    """A bool input, or an integer one whose name says mask or padding (attention_mask, src_key_padding_mask)."""
    if value.dtype == "bool":
        return True
    return value.dtype not in _FLOAT and bool(_MASK_NAME.search(value.name or ""))


def resolve_shape(value: Value, dims: dict[str, int], guessed: dict[str, int] | None = None,
                  batch: int = BATCH_DEFAULT) -> tuple[int, ...]:
    """Concrete sizes for an input: fixed dims as stored, symbolic ones from --dim or the defaults (each default
    used is recorded in guessed: the report names it with the value chosen)."""
    shape = []
    for i, d in enumerate(value.shape or ()):
        if isinstance(d, int) and d > 0:
            shape.append(d)
            continue
        key = dim_key(value, i, d)
        if key in dims:
            shape.append(dims[key])
            continue
        size = batch if i == 0 or (isinstance(d, str) and "batch" in d.lower()) else DIM_DEFAULT
        shape.append(size)
        if guessed is not None:
            guessed[key] = size
    return tuple(shape)


@dataclass
class InputSource:
    """Where a run's inputs came from: the user's files, or synthesized (seed, samples, the dims guessed)."""

    files: list[str] = field(default_factory=list)
    seed: int | None = None
    samples: int = 1
    guessed: dict[str, int] = field(default_factory=dict)  # symbolic dims precaudit chose: name -> size
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # --range NAME=LO:HI, synthesized only
    masks: list[str] = field(default_factory=list)  # inputs synthesized as masks, in every state

    @property
    def synthesized(self) -> bool:
        return not self.files

    @property
    def kind(self) -> str:
        return "synthesized" if self.synthesized else "user"

    def describe(self) -> str:
        if self.files:
            return f"inputs from {', '.join(self.files)}"
        text = f"{self.samples} synthesized sample{'s' * (self.samples != 1)} (seed {self.seed})"
        return text + (f"; guessed {self.guessed_text()}" if self.guessed else "")

    def guessed_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.guessed.items())

    def shape_hint(self) -> str:
        """What to add to an onnxruntime shape error: the dims precaudit guessed, and how to set them."""
        if not self.guessed:
            return ""
        return f" (precaudit guessed the symbolic dims {self.guessed_text()}: set them with --dim NAME=SIZE)"

    def record(self) -> dict:
        return {"source": self.kind, "files": list(self.files), "seed": self.seed, "samples": self.samples,
                "guessed_dims": dict(self.guessed), "ranges": {k: list(v) for k, v in self.ranges.items()},
                "masks": list(self.masks)}


def _source(graph: Graph, options: TraceOptions) -> InputSource:
    """The InputSource of a run before any batch is made: for synthesized inputs, the dims it will guess."""
    if options.inputs:
        return InputSource(list(options.inputs), None, len(options.inputs))
    check_dim_names(graph, options.dims)
    _check_ranges(graph, options.ranges)
    source = InputSource([], options.seed, max(1, options.samples), ranges=dict(options.ranges))
    source.masks = [v.name for v in graph.inputs if is_mask(v)]
    batch = MASK_ROWS if source.masks else BATCH_DEFAULT
    for value in graph.inputs:
        resolve_shape(value, options.dims, source.guessed, batch)
    return source


def iter_batches(graph: Graph, options: TraceOptions) -> tuple[InputSource, Iterator[dict[str, np.ndarray]]]:
    """Each batch in turn (one in memory at a time), with where they come from."""
    source = _source(graph, options)

    def batches() -> Iterator[dict[str, np.ndarray]]:
        for i in range(source.samples):
            if options.inputs:
                yield load_inputs(graph, options.inputs[i], options.dims)
            else:
                yield synthesize_inputs(graph, options.dims, options.seed + i, options.ranges)
    return source, batches()


def input_batches(graph: Graph, options: TraceOptions) -> tuple[list[dict[str, np.ndarray]], InputSource]:
    """Every batch at once (fix and keep-list run several models on the same ones), with where they come from."""
    source, batches = iter_batches(graph, options)
    return list(batches), source


_MAX_ELEMENTS = 2**28  # 1 GiB of float32 per input: past that a synthesized batch is a mistake, not a test


def _check_ranges(graph: Graph, ranges: dict[str, tuple[float, float]]) -> None:
    names = [v.name for v in graph.inputs]
    for name in ranges:
        if name not in names:
            raise InputError(graph.path, f"--range {name}: no graph input of that name (the inputs are: "
                                         f"{', '.join(names)})")


def synthesize_inputs(graph: Graph, dims: dict[str, int], seed: int,
                      ranges: dict[str, tuple[float, float]] | None = None) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1), or uniform in the input's --range; integer ids below the size of the table they index;
    masks in every state, row by row (is_mask, _mask); other integers 1."""
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    check_dim_names(graph, dims)
    batch = MASK_ROWS if any(is_mask(v) for v in graph.inputs) else BATCH_DEFAULT
    feeds = {}
    for value in graph.inputs:
        if value.shape is None:
            raise InputError(graph.path, f"input '{value.name}' has no shape in the model: give it with --inputs FILE.npz")
        shape = resolve_shape(value, dims, batch=batch)
        elements = int(np.prod(shape, dtype=np.float64))
        if elements > _MAX_ELEMENTS:
            raise InputError(graph.path, f"input '{value.name}' would have shape {tuple(shape)} ({elements:.3g} values): "
                                         "too large to synthesize; give smaller --dim sizes or your own --inputs FILE.npz")
        if value.name in ranges:
            lo, hi = ranges[value.name]
            drawn = rng.uniform(lo, hi, shape)
            feeds[value.name] = (drawn.astype(_NP_FLOAT.get(value.dtype, np.float32)) if value.dtype in _FLOAT
                                 else np.rint(drawn).astype(np.dtype(value.dtype or "int64")))
        elif value.dtype in _FLOAT:
            feeds[value.name] = rng.standard_normal(shape).astype(_NP_FLOAT.get(value.dtype, np.float32))
        elif is_mask(value) and shape:
            mask = _mask(shape, np.dtype(bool if value.dtype == "bool" else value.dtype or "int64"))
            feeds[value.name] = (1 - mask).astype(mask.dtype) if _marks_padding(value) else mask
        elif value.dtype == "bool":  # a scalar flag (an If's condition): true in even samples, false in odd ones
            feeds[value.name] = np.full(shape, seed % 2 == 0, dtype=bool)
        else:
            table = _table_size(value)
            dtype = np.dtype(value.dtype or "int64")
            if table:
                feeds[value.name] = rng.integers(0, table, shape).astype(dtype)
            elif dtype in (np.uint8, np.int16):  # 0-255 pixels, int16 PCM audio: the type says the range
                info = np.iinfo(dtype)
                feeds[value.name] = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
            else:
                feeds[value.name] = np.ones(shape, dtype=dtype)
    return feeds


def _mask(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Row r of the first dim: all ones (r % 2 == 0), ones then zeros along the last dim (1). With one row, the
    partly valid one: a mask is never synthesized in one state only, and never with no valid position."""
    out = np.ones(shape, dtype=dtype)
    if not shape:
        return out
    rows = shape[0]
    half = (shape[-1] + 1) // 2 if len(shape) > 1 else 0
    for r in range(rows):
        state = 1 if rows == 1 else r % MASK_ROWS
        if state == 1:
            if len(shape) > 1:
                out[r, ..., half:] = 0
            else:
                out[r] = 0 if rows > 1 else 1
    return out


# ops a mask passes through on its way to the Where that applies it (Not flips what True means)
_MASK_PATH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Identity", "Not", "Transpose"}


def _marks_padding(value: Value) -> bool:
    """Whether True (1) marks the positions to leave out (PyTorch's key_padding_mask), not those to attend (HF's
    attention_mask): read from the Where that applies it, Where(mask, fill, scores) with a large negative fill, or
    from the name (padding). Without either, 1 means valid, as attention_mask does."""
    frontier: list[tuple[Value, bool]] = [(value, False)]
    seen = 0
    while frontier and seen < 32:
        current, flipped = frontier.pop()
        seen += 1
        for user in current.consumers:
            if user.op_type == "Where" and user.input(0) is current:
                fill_first = _is_fill(user.input(1))
                if fill_first or _is_fill(user.input(2)):
                    return fill_first != flipped
            elif user.op_type in _MASK_PATH and user.input(0) is current:
                frontier += [(out, flipped != (user.op_type == "Not")) for out in user.outputs]
    return "padding" in value.name.lower()


def _is_fill(value: Value | None) -> bool:
    """A large negative constant: what a mask writes where it leaves a position out (-inf, finfo.min, -1e9)."""
    from ..analysis.constants import resolve_scalar

    c = resolve_scalar(value)
    return c is not None and c.value <= -1e4


def _table_size(value: Value) -> int | None:
    """The number of rows of the embedding table an integer input indexes (through Casts and reshapes), if any."""
    frontier, seen = [value], 0
    sizes = []
    while frontier and seen < 64:
        current = frontier.pop()
        seen += 1
        for user in current.consumers:
            table = user.input(0)
            if user.op_type == "Gather" and user.input(1) is current and table is not None:
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
    if (is_float and array.dtype.kind not in "fiu") or (not is_float and array.dtype.kind not in "iub"):
        raise InputError(path, f"input '{value.name}': array of {array.dtype} where the model expects {value.dtype}")
    if is_float:  # numpy.savez writes float64 by default: the model's input dtype is what it runs on
        want = _NP_FLOAT.get(value.dtype or "")
        return array.astype(want) if want is not None else array.astype(np.float32) if array.dtype.kind != "f" else array
    return array.astype(np.dtype(value.dtype)) if value.dtype and value.dtype != "bool" else array


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"
