"""The format each value is held in during the emulated run, and how each reader reads a constant."""

from __future__ import annotations

from typing import cast

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..converters import Clamp
from ..dtypes import FORMATS, Format
from ..ir import Graph, Node, Value

__all__ = ["HeldFormats"]


class HeldFormats:
    """The resolver's formats as the emulated run holds values, worked out once per value."""

    def __init__(self, graph: Graph, resolver: DtypeResolver):
        self.graph = graph
        self.resolver = resolver
        self._cache: dict[int, Format | None] = {}
        self._readers_blocked: dict[int, list[bool]] = {}

    def of(self, value: Value) -> Format | None:
        """The format a value is held in: the resolver's answer, except inside a --keep-fp32 block.

        A converter with an op block list casts only at the block's edges, so a value made by a kept node
        and read only by kept nodes stays float32.
        """
        held = self._cache.get(id(value), self)
        if held is self:
            held = self._cache[id(value)] = self._uncached(value)
        return cast("Format | None", held)  # (self only marks a value not seen yet, and is replaced above)

    def _uncached(self, value: Value) -> Format | None:
        node = value.producer
        resolver = self.resolver
        dtype = resolver.of_value(value)
        if dtype is None and value.dtype is None and node is not None:
            dtype = resolver.of_node(node)
        if dtype is None:
            return None
        if (node is not None and resolver.kept_by(node)
                and all(resolver.kept_by(c) for c in value.consumers)
                and ((value.consumers and value not in self.graph.outputs)
                     or (resolver.keep_io and value in self.graph.outputs))):
            return FORMATS["fp32"]  # keep_io_types=True: a kept node's graph output stays float32 too
        if (node is None and resolver.keep_io and value in self.graph.inputs and value.consumers
                and all(resolver.kept_by(c) for c in value.consumers)):
            return FORMATS["fp32"]  # keep_io_types=True: a float32 input, cast only before readers not kept
        return dtype.fmt

    def const_read(self, value: Value, reader: Node) -> tuple[bool, Clamp | None]:
        """How `reader` reads a constant in the emulated run, as the --converter leaves it: (converted, clamp).

        converted: the copy rounded into the format the constant is held in, after `clamp` where the converter
        clamps it; otherwise the numbers as stored (a converter leaves a constant only blocked nodes read in
        float32: converters/ says which). Without a converter (or a constant it does not convert: stored in another
        dtype, held in float32) every reader reads the constant rounded as it is.
        """
        resolver = self.resolver
        fmt = self.of(value)
        if not resolver.converting or value.dtype != "fp32" or fmt is None or fmt.wide:
            return True, None
        dtype = resolver.of_value(value)
        maker = value.producer
        initializer = maker is None or maker.op_type != "Constant"
        readers = self._readers_blocked.get(id(value))
        if readers is None:
            readers = self._readers_blocked[id(value)] = [resolver.kept_by(c) is not None for c in value.consumers]
        converted, clamped = resolver.converter.reads_converted(
            initializer, maker is not None and resolver.kept_by(maker) is not None, readers,
            resolver.kept_by(reader) is not None)
        clamp = dtype.clamp if dtype is not None else None
        if not clamped or clamp is None or not clamp.applies_to(value.const_origin or ""):
            clamp = None
        return converted, clamp

    def stored_as_held(self, value: Value, data: np.ndarray) -> bool:
        """Whether a constant's stored numbers are already those of the format it is held in (an fp16 weight held
        in fp16): its emulated copy is then its float32 reference, number for number."""
        fmt = self.of(value)
        return fmt is not None and data.dtype == fmt.np_dtype and fmt.held_dtype is np.float32
