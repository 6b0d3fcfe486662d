"""The ONNX file as `precaudit fix` edits it: the proto (weights never loaded), each IR node's NodeProto, and
edits that are collected first and applied once (new initializers, nodes inserted next to an anchor, nodes and
value_info entries dropped).

The IR the audit ran on comes from frontends.onnx.load_onnx; this module reads the same file again as a proto and
walks it in the order the frontend's builder did (each node, then its bodies' nodes), so every IR node maps to the
NodeProto it was built from, names checked. Nothing here reads a weight: external tensors stay entries that point
at their files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto as T
from onnx import numpy_helper

from ..dtypes import FORMATS
from ..errors import InputError
from ..files import open_regular
from ..frontends.onnx_data import text
from ..ir import Graph, Node

__all__ = ["ELEM_OF", "Editable", "elem_type", "external_tensors", "relocate_external"]

_MAX_MODEL_BYTES = 2 << 30

# IR dtype names (dtypes.FORMATS keys) to ONNX element types
ELEM_OF = {name: fmt.onnx_type for name, fmt in FORMATS.items()}


def elem_type(dtype: str | None) -> int:
    """The ONNX element type of an IR dtype name (float formats), or 0 when unknown."""
    return ELEM_OF.get(dtype or "", 0)


@dataclass
class _Where:
    graph: onnx.GraphProto
    proto: onnx.NodeProto


@dataclass
class Editable:
    """An ONNX model being repaired. Edits are collected, then apply() writes them into the proto in one pass."""

    path: str
    model: onnx.ModelProto
    inlined: bool = False
    _where: dict[int, _Where] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set)
    _before: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # id(anchor proto) -> nodes to insert
    _after: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    _dropped: set[int] = field(default_factory=set)  # id(node proto) to remove
    _stale_types: set[str] = field(default_factory=set)  # value_info entries whose dtype an edit changed
    _inits: dict[int, list[onnx.TensorProto]] = field(default_factory=dict)  # id(graph) -> new initializers
    _head: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # id(graph) -> new Constant nodes, first
    _orphans: dict[int, onnx.NodeProto] = field(default_factory=dict)
    touched: set[int] = field(default_factory=set)  # id(IR node) an edit changed: one repair per node

    @classmethod
    def load(cls, path: str, graph: Graph) -> Editable:
        model = _read(path)
        inlined = bool(model.functions)
        if inlined:  # the audit ran on the inlined graph (frontends.onnx does the same): edit that one
            model = onnx.inliner.inline_local_functions(model)
        edit = cls(path, model, inlined)
        edit._map(graph)
        return edit

    # ---- where things are ------------------------------------------------------------------------------------

    def _map(self, graph: Graph) -> None:
        """Walk the proto as frontends.onnx_builder._Builder.build did, pairing each IR node with its NodeProto."""
        ir = iter(graph.nodes)
        stack = [(self.model.graph, iter(self.model.graph.node), "")]
        while stack:
            gp, nodes, path = stack[-1]
            np_ = next(nodes, None)
            if np_ is None:
                stack.pop()
                continue
            node = next(ir, None)
            outputs = [text(o) for o in np_.output]
            name = path + (text(np_.name) or f"{text(np_.op_type)}_{outputs[0] if outputs else ''}")
            if node is None or node.name != name:
                raise InputError(self.path, "cannot edit this model: its nodes do not read back in the order the "
                                            "audit saw them")
            self._where[id(node)] = _Where(gp, np_)
            self._names.add(text(np_.name))
            self._names.update(outputs)
            self._names.update(text(i) for i in np_.input)
            bodies = []
            for attr in np_.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    bodies.append((attr.g, f"{node.name}/{text(attr.name)}/"))
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    bodies += [(g, f"{node.name}/{text(attr.name)}/") for g in attr.graphs]
            for body, body_path in reversed(bodies):  # the first body is walked first
                stack.append((body, iter(body.node), body_path))
                self._names.update(text(i.name) for i in body.initializer)
                self._names.update(text(i.name) for i in body.input)
        self._names.update(text(i.name) for i in self.model.graph.initializer)
        self._names.update(text(i.name) for i in self.model.graph.input)

    def proto(self, node: Node) -> onnx.NodeProto:
        return self._where[id(node)].proto

    def graph_of(self, node: Node) -> onnx.GraphProto:
        return self._where[id(node)].graph

    def unique(self, hint: str) -> str:
        """A node or value name no other in the model has: hint, or hint_2, hint_3, ..."""
        name, i = hint, 1
        while name in self._names:
            i += 1
            name = f"{hint}_{i}"
        self._names.add(name)
        return name

    # ---- edits -----------------------------------------------------------------------------------------------

    @property
    def constant_word(self) -> str:
        """What a new constant is in this model, as the report names it."""
        return "initializer" if self.model.ir_version > 3 else "Constant node"

    def add_named_initializer(self, near: Node, name: str, array: np.ndarray) -> None:
        """A new initializer (in the graph that holds `near`) under a name unique() gave; never a change to an
        existing one, which other nodes may read.

        IR version 3 and older require every initializer to be a graph input too, and a body's inputs are fixed by
        its If/Loop/Scan (onnx.checker: 'in initializer but not in graph input'): there the constant is a Constant
        node at the head of that graph, before every reader, which every IR version and every graph accepts."""
        tensor = numpy_helper.from_array(np.asarray(array), name)
        if self.model.ir_version <= 3:
            node = onnx.helper.make_node("Constant", [], [name], name=self.unique(f"{name}/constant"), value=tensor)
            self._head.setdefault(id(self.graph_of(near)), []).append(node)
            return
        self._inits.setdefault(id(self.graph_of(near)), []).append(tensor)

    def make_node(self, op: str, inputs: list[str], outputs: list[str], name_hint: str, **attrs) -> onnx.NodeProto:
        return onnx.helper.make_node(op, inputs, outputs, name=self.unique(name_hint), **attrs)

    def insert_before(self, anchor: Node, *nodes: onnx.NodeProto) -> None:
        self._before.setdefault(id(self.proto(anchor)), []).extend(nodes)

    def insert_after(self, anchor: Node, *nodes: onnx.NodeProto) -> None:
        self._after.setdefault(id(self.proto(anchor)), []).extend(nodes)

    def drop(self, node: Node) -> None:
        self._dropped.add(id(self.proto(node)))

    def orphan(self, *nodes: Node) -> None:
        """Nodes an edit may have left without readers: removed at apply() if nothing reads them any more."""
        for node in nodes:
            if node is not None and id(node) in self._where:
                self._orphans[id(self.proto(node))] = self.proto(node)

    def retyped(self, *names: str) -> None:
        """Values whose dtype an edit changed: their value_info entries go (the checker infers them again)."""
        self._stale_types.update(names)

    def set_input(self, node: Node, index: int, name: str) -> None:
        self.proto(node).input[index] = name

    def set_attr(self, node: Node, name: str, value) -> None:
        proto = self.proto(node)
        for i, attr in enumerate(proto.attribute):
            if text(attr.name) == name:
                del proto.attribute[i]
                break
        proto.attribute.append(onnx.helper.make_attribute(name, value))

    def apply(self) -> onnx.ModelProto:
        """Write every collected edit into the proto (once: node references go stale when a list is rebuilt)."""
        graphs = {id(self.model.graph): self.model.graph}
        graphs.update((id(w.graph), w.graph) for w in self._where.values())
        self._prune(graphs)
        # a body comes after its parent graph here (the walk's order): edit the bodies first. Rebuilding a graph's
        # node list copies each node, its bodies included, so a body edited after its parent was rebuilt would be
        # edited in a copy no longer in the model (an eps raised inside an If lost its new initializer)
        for gid, gp in reversed(graphs.items()):
            nodes = list(gp.node)
            if gid in self._head or any(id(n) in self._before or id(n) in self._after or id(n) in self._dropped
                                        for n in nodes):
                ordered = list(self._head.get(gid, []))
                for n in nodes:
                    ordered += self._before.get(id(n), [])
                    if id(n) not in self._dropped:
                        ordered.append(n)
                    ordered += self._after.get(id(n), [])
                del gp.node[:]
                gp.node.extend(ordered)
            gp.initializer.extend(self._inits.get(gid, []))
            if self._stale_types:
                kept = [vi for vi in gp.value_info if text(vi.name) not in self._stale_types]
                if len(kept) != len(gp.value_info):
                    del gp.value_info[:]
                    gp.value_info.extend(kept)
        self._where.clear()
        return self.model


    def _prune(self, graphs: dict[int, onnx.GraphProto]) -> None:
        """Drop the orphans nothing reads any more (a name read anywhere, in any body, counts as read)."""
        if not self._orphans:
            return
        pending = [n for extra in (*self._before.values(), *self._after.values(), *self._head.values()) for n in extra]
        while True:
            used: set[str] = set()
            for gp in graphs.values():
                used.update(text(o.name) for o in gp.output)
                for n in [*gp.node]:
                    if id(n) not in self._dropped:
                        used.update(text(i) for i in n.input)
            used.update(text(i) for n in pending for i in n.input)
            dead = [pid for pid, n in self._orphans.items() if pid not in self._dropped
                    and not any(text(o) in used for o in n.output if o)]
            if not dead:
                return
            self._dropped.update(dead)


def _read(path: str) -> onnx.ModelProto:
    with open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size > _MAX_MODEL_BYTES:
            raise InputError(path, "is larger than 2 GiB, the most an ONNX file can hold")
        data = fh.read()
    try:
        return onnx.load_model_from_string(data)
    except Exception as exc:  # load_onnx read it a moment ago: only a file changed meanwhile gets here
        raise InputError(path, f"not a readable ONNX model ({type(exc).__name__})") from None


def external_tensors(model: onnx.ModelProto):
    """Every tensor of the model stored in external data: initializers and Constant values, bodies included."""
    stack = [model.graph]
    while stack:
        gp = stack.pop()
        for init in gp.initializer:
            if init.data_location == T.EXTERNAL:
                yield init
        for node in gp.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_location == T.EXTERNAL:
                    yield attr.t
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def relocate_external(model: onnx.ModelProto, model_dir: Path, out_dir: Path, shown: str) -> list[str]:
    """Point every external entry at the same file, relative to the folder the fixed model is written to.

    The data files are never copied, linked or opened for writing: the fixed model reads the original's weights in
    place. A file is reachable only from a folder that holds it (ONNX loaders, precaudit's included, refuse a
    location that leaves the model's folder), so a fixed model written elsewhere is refused. Returns the files.
    """
    files: dict[str, str] = {}
    for tensor in external_tensors(model):
        entries = {text(e.key): e for e in tensor.external_data}
        location = text(entries["location"].value)
        target = (model_dir / location).resolve()
        new = os.path.relpath(target, out_dir)
        if os.path.isabs(new) or new == ".." or new.startswith(".." + os.sep):
            raise InputError(shown, f"the model keeps weights in external data ({location!r}), which a fixed model "
                                    f"written to {str(out_dir)!r} cannot reach: a model reads external data only from "
                                    f"inside its own folder. Write the fixed model next to the original (or in a folder "
                                    f"that holds the data file); it references the weights in place, never a copy")
        entries["location"].value = Path(new).as_posix()
        files[str(target)] = Path(new).as_posix()
    return sorted(set(files.values()))


