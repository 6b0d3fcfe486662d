"""A small graph IR shared by every frontend: values, nodes, and the graph that links them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CONST_CACHE_BYTES", "UNKNOWN", "Graph", "Node", "Value", "body_nodes", "duplicate_renames", "generated_name",
           "implicit_inputs", "shown_node", "shown_origin"]

# What a memo slot of a Value holds until its fact is first worked out (analysis/constants.py).
UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN", "__slots__": ()})()

# Constants up to this size are cached by Value.const(); larger ones (weights) are read again when asked.
CONST_CACHE_BYTES = 1 << 20


class Value:
    """A tensor: its stored dtype and shape where known, who makes it and who reads it.

    A plain class with __slots__ (a large graph holds tens of thousands of values: no per-object dict). The shape
    may be given unread, as the declaration a frontend found (an ONNX TensorShapeProto): it is read into a tuple
    the first time it is asked for, and most values' shapes never are.
    """

    __slots__ = (
        "_bounds",
        "_const_cache",
        "_constant",
        "_fill",
        "_scalar",
        "_shape",
        "const_loader",
        "const_origin",
        "const_size",
        "consumers",
        "dtype",
        "dtype_note",
        "is_graph_input",
        "name",
        "parent",
        "producer",
    )

    def __init__(self, name: str, dtype: str | None = None, dtype_note: str | None = None, shape: Any = None,
                 producer: Node | None = None, consumers: list[Node] | None = None, is_graph_input: bool = False,
                 parent: Node | None = None, const_loader: Callable[[], np.ndarray | None] | None = None,
                 const_origin: str | None = None, const_size: int | None = None, _const_cache: Any = None):
        self.name = name
        # canonical format name ("fp16", "fp32", ...) for floats, numpy name otherwise
        self.dtype = dtype
        # Why a frontend gave this value its dtype, when the graph alone cannot say (a PyTorch op under autocast:
        # "autocast(cuda) runs matmul in float16"); the dtype resolver then reports it as is.
        self.dtype_note = dtype_note
        self._shape = shape  # ints for known dims, strings for symbolic ones, None for unknown (or unread: above)
        self.producer = producer
        self.consumers = [] if consumers is None else consumers
        self.is_graph_input = is_graph_input
        # the If/Loop/Scan node whose body defines this value (its input, initializer or node output); None at top
        self.parent = parent
        # A loader for constant data (initializer, Constant node); called only when a rule needs the value.
        self.const_loader = const_loader
        self.const_origin = const_origin  # "initializer 'w'", "Constant node 'c'", "initializer 'w' (external data)"
        self.const_size = const_size  # number of elements, known without loading
        self._const_cache = _const_cache
        # Facts that depend only on the graph upstream, worked out once when first asked (analysis/constants.py:
        # resolve_scalar, is_constant, resolve_fill; analysis/bounds.py: bounds_of, with the --dim sizes it used): a
        # frontend has finished the graph by then, and nothing changes it after.
        self._scalar = UNKNOWN
        self._constant = UNKNOWN
        self._fill = UNKNOWN
        self._bounds: Any = UNKNOWN

    def __repr__(self) -> str:
        return f"Value(name={self.name!r}, dtype={self.dtype!r}, shape={self.shape!r})"

    @property
    def shape(self) -> tuple | None:
        shape = self._shape
        if shape is None or shape.__class__ is tuple:
            return shape
        if hasattr(shape, "dim"):  # an unread TensorShapeProto
            shape = self._shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                        for d in shape.dim)
        return shape

    @shape.setter
    def shape(self, shape: tuple | None) -> None:
        self._shape = shape

    @property
    def is_const(self) -> bool:
        return self.const_loader is not None

    def const(self) -> np.ndarray | None:
        """The constant's data; None if the value is not a constant.

        Small constants (eps, axes, shapes: at most CONST_CACHE_BYTES) are loaded once and kept. Larger ones, the
        weights, are read afresh at each call and kept by no one but the caller: an audit that reads every weight
        (traced mode, --check-weights) then holds one at a time, not the model. External weights are memory-mapped
        (frontends/onnx_data.py), so reading one again costs a mapping, not a copy.
        """
        if self.const_loader is None:
            return None
        if self._const_cache is not None:
            return self._const_cache
        data = self.const_loader()
        if data is not None and np.asarray(data).nbytes <= CONST_CACHE_BYTES:
            self._const_cache = data
        return data


@dataclass(eq=False, slots=True)
class Node:
    """One operation, with the metadata a finding needs to point back at its source (slots: no per-node dict)."""

    name: str
    op_type: str
    domain: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[Value | None] = field(default_factory=list)  # None for an omitted optional input
    outputs: list[Value] = field(default_factory=list)
    opset: int | None = None  # version of the node's domain imported by the model
    scope: str | None = None  # module path, e.g. "encoder.layer.0.attention.output.LayerNorm"
    source_file: str | None = None
    source_line: int | None = None
    # (file, line) of the user's call that led into a library module whose own forward() is source_file:line
    call_site: tuple[str, int] | None = None
    subgraph_path: str = ""  # "If_3/then_branch" for nodes inside a control-flow body
    # If/Loop/Scan bodies as the ONNX file holds them (their nodes are also in Graph.nodes, with a subgraph_path):
    # traced mode hands them to onnxruntime whole
    bodies: dict[str, Any] = field(default_factory=dict)
    body_nodes: dict[str, list[Node]] = field(default_factory=dict, repr=False)  # per body, its own nodes in order
    parent: Node | None = field(default=None, repr=False)  # the control-flow node whose body holds this node
    # the file gives it no name: precaudit named it (generated_name below), and a snippet names it so first
    unnamed: bool = False
    # (file, line) the dynamo exporter recorded for a node of an ONNX file, when that file is in this repository: a
    # related location (the exporting machine's line), never the finding's own, which is the model and the node
    recorded_at: tuple[str, int] | None = None

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


@dataclass(eq=False)
class Graph:
    """Every node of a model, control-flow bodies and local functions included, in topological order."""

    path: str  # the model file as the user named it
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    producer_name: str = ""
    exporter: str = ""  # "torch-dynamo", "torch-torchscript", or the producer name: exporter facts depend on it
    module_eps: dict[str, str] = field(default_factory=dict)  # module path -> "LayerNorm.eps = 1e-12" (torch)
    converted_to: str | None = None  # a PyTorch module precaudit converted with model.to(dtype) before capture
    # a PyTorch module's dynamo ONNX export: node name -> the torch.export node it was lowered from (torch-side
    # keep-lists name those: Torch-TensorRT's nodes_to_exclude, coremltools' op names)
    fx_names: dict[str, str] = field(default_factory=dict)
    # Every node reads only values defined before it (the ONNX frontend checks it as it builds): walking producers
    # never meets a cycle, so an analysis may walk only the inputs it needs (analysis/signs.py).
    acyclic: bool = False
    # Sizes the user gave symbolic dims (--dim seq=4096): the static pass bounds what such a dim makes by them
    dim_sizes: dict[str, int] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def by_op(self, *op_types: str) -> list[Node]:
        return [n for n in self.nodes if n.op_type in op_types]


def generated_name(op_type: str, first_output: str, taken: set[str]) -> str:
    """The name precaudit (and a keep-list snippet's naming loop, converters.KeepArgs.naming) gives a node the file leaves
    unnamed: op type _ first output, then ~1, ~2 ... until no node of the file is named so. Output names are unique
    in a model, so only the file's own names can collide; checking only those makes the name independent of the
    order nodes are named in."""
    base = name = f"{op_type}_{first_output}"
    k = 0
    while name in taken:
        k += 1
        name = f"{base}~{k}"
    return name


def shown_node(node: Node) -> str:
    """A node as a message names it: "MatMul 'proj'", or, where the file gives it no name, "the unnamed MatMul node
    that makes 'y'": precaudit's generated name is no name a converter's block list can reach before the nodes are
    named as a keep-list snippet names them."""
    if node.unnamed and node.outputs:
        return f"the unnamed {node.op_type} node that makes '{node.outputs[0].name}'"
    return f"{node.op_type} '{node.name}'"


def shown_origin(value: Value) -> str:
    """Where a constant is stored, as a message names it: its const_origin ("initializer 'w'", "Constant node 'c'"),
    or the Constant node by the tensor it makes where the file leaves the node unnamed. const_origin itself keeps
    precaudit's name: it is the key a converter's clamp is decided by (Clamp.applies_to)."""
    maker = value.producer
    if maker is not None and maker.unnamed and maker.op_type == "Constant":
        return shown_node(maker)
    return value.const_origin or f"constant '{value.name}'"


def duplicate_renames(graph: Graph) -> dict[int, str]:
    """id(node) → the name a keep-list snippet gives a node whose graph already has a node of its name.

    onnxruntime refuses a model with two nodes of one name in one graph ("two nodes with same node name"), and a
    converter's node_block_list cannot tell them apart: the snippet renames every repeat first. Within each graph
    (the main graph, each body), in node order, the k-th repeat of a name N takes the k-th of N~1, N~2 ... that no
    node of the file is named: independent of the order graphs are visited in, as the snippet's loop is."""
    def file_name(node: Node) -> str:
        path = node.subgraph_path
        return node.name[len(path):] if path and node.name.startswith(path) else node.name

    names = [(node, file_name(node)) for node in graph.nodes if not node.unnamed]
    taken = {name for _, name in names}
    seen: dict[str, set[str]] = {}  # per graph, the names met so far
    repeats: dict[tuple[str, str], int] = {}  # per graph and name, the last k taken
    renames: dict[int, str] = {}
    for node, name in names:
        in_graph = seen.setdefault(node.subgraph_path, set())
        if name not in in_graph:
            in_graph.add(name)
            continue
        k = repeats.get((node.subgraph_path, name), 0) + 1
        while f"{name}~{k}" in taken:
            k += 1
        repeats[(node.subgraph_path, name)] = k
        renames[id(node)] = f"{name}~{k}"
    return renames


def implicit_inputs(node: Node) -> list[Value]:
    """The values from outside that a control-flow node's bodies read by name (outer-scope references).

    Decided by which value a name resolves to, not by the name: a sibling body may define the same name.
    """
    found: dict[int, Value] = {}
    for inner in body_nodes(node):
        for v in inner.inputs:
            if v is not None and not _inside(v, node):
                found.setdefault(id(v), v)
    return list(found.values())


def body_nodes(node: Node) -> list[Node]:
    """Every node in a control-flow node's bodies, nested bodies included.

    In body order, each node followed by its own bodies' nodes; walked with an explicit stack, so nesting
    costs no recursion.
    """
    out: list[Node] = []
    stack = [(inner for nodes in node.body_nodes.values() for inner in nodes)]
    while stack:
        inner = next(stack[-1], None)
        if inner is None:
            stack.pop()
            continue
        out.append(inner)
        if inner.body_nodes:
            stack.append(n for nodes in inner.body_nodes.values() for n in nodes)
    return out


def _inside(value: Value, node: Node) -> bool:
    """Whether a body of node (or a body nested in one) defines value."""
    parent = value.parent
    while parent is not None:
        if parent is node:
            return True
        parent = parent.parent
    return False
