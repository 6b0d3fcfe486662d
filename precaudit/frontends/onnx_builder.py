"""Walk an ONNX GraphProto (and its control-flow bodies) into the IR, reading no weight: frontends/onnx.py reads the
file and infers the types this reads."""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import onnx

from ..dtypes import format_of_onnx_type
from ..errors import InputError
from ..ir import Graph, Node, Value, generated_name
from .onnx_data import element_count, tensor_loader, text
from .source import in_repository, user_frame

__all__ = ["Undeclared", "build_graph"]

# Keys the torch dynamo exporter writes into node.metadata_props.
_META_SCOPE = "pkg.torch.onnx.name_scopes"
_META_STACK = "pkg.torch.onnx.stack_trace"


def build_graph(path: str, model_dir: Path, model: onnx.ModelProto, declared_only: bool = False,
                resorted: bool = False) -> Graph:
    """The IR of the model; declared_only: raise Undeclared at the first value the file leaves to inference.
    resorted: the nodes were put in the order onnxruntime runs them (onnx_order.sort_for_bodies), after a body read
    a value only a later node of its parent makes (ReadLater)."""
    opsets = {_domain(text(imp.domain)): imp.version for imp in model.opset_import}
    builder = _Builder(path, model_dir, opsets, declared_only)
    builder.resorted = resorted
    graph = Graph(path=path, producer_name=text(model.producer_name))
    builder.build(model.graph, graph, scope={}, subgraph_path="")
    graph.acyclic = True  # the builder refused any value read before it was defined
    graph.exporter = _exporter(model)
    return graph


class Undeclared(Exception):
    """A node output without a declared tensor type and shape, or a control-flow body: inference is needed."""


class ReadLater(Exception):
    """A body reads a value no earlier node defines: perhaps a later node of an outer graph (see onnx.load_onnx)."""


def _domain(name: str) -> str:
    """"ai.onnx" and "" both name the default domain; imports and nodes may spell it either way."""
    return "" if name in ("", "ai.onnx") else name


def _exporter(model: onnx.ModelProto) -> str:
    """Which exporter wrote the model; the dynamo exporter leaves pkg.torch.onnx metadata on its nodes."""
    if any(text(p.key).startswith("pkg.torch.onnx") for n in model.graph.node[:50] for p in n.metadata_props):
        return "torch-dynamo"
    if model.producer_name == "pytorch":
        return "torch-torchscript"
    return text(model.producer_name)


_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_FLOAT, _INT, _STRING, _TENSOR = (onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT, onnx.AttributeProto.STRING,
                                  onnx.AttributeProto.TENSOR)
_FLOATS, _INTS = onnx.AttributeProto.FLOATS, onnx.AttributeProto.INTS
# Shared by every node without control-flow bodies (most of them): the builder alone fills these maps, so an empty
# one per node would only cost memory.
_NO_BODIES: dict = {}
_NO_BODY_NODES: dict = {}


class _Builder:
    """Walks a GraphProto (and the bodies of If/Loop/Scan) into one flat IR graph.

    One pass, a few dict lookups per node: names are taken as protobuf hands them over (text() only for the rare
    field that is not UTF-8), op types interned, attributes read by type, module scopes derived once per name
    prefix, exporter metadata read only where a node has some, and shapes left unread until asked
    (ir.Value.shape).
    """

    def __init__(self, path: str, model_dir: Path, opsets: dict[str, int], declared_only: bool = False):
        self.path = path
        self.declared_only = declared_only  # raise Undeclared where the file leaves a value's type to inference
        self.model_dir = model_dir
        self.opsets = opsets
        self.default_opset = opsets.get("")
        self.types: dict[str, onnx.TypeProto] = {}
        self._schemas: dict[tuple, dict[str, int]] = {}
        self._scopes: dict[str, str | None] = {}  # a TorchScript name's path prefix -> the module path it names
        self._noted: set[str] = set()  # external data files already recorded as read (files.note_read)
        self._root: onnx.GraphProto | None = None
        self._taken: set[str] | None = None  # every name the file gives a node, read at the first unnamed node
        self.resorted = False  # the nodes were put in the order onnxruntime runs them (build_graph)

    def _explicit_names(self) -> set[str]:
        """The names the file gives its nodes, bodies included (iterative): what a generated name must not be."""
        if self._taken is None:
            taken: set[str] = set()
            todo = [self._root] if self._root is not None else []
            while todo:
                g = todo.pop()
                for n in g.node:
                    if n.name:
                        taken.add(n.name if n.name.__class__ is str else text(n.name))
                    for a in n.attribute:
                        todo += [a.g] if a.HasField("g") else list(a.graphs)
            self._taken = taken
        return self._taken

    def build(self, gp: onnx.GraphProto, graph: Graph, scope: dict[str, Value], subgraph_path: str,
              parent: Node | None = None) -> list[Node]:
        """Add gp's nodes (and their bodies' nodes) to graph; gp's own nodes, in order."""
        scope = dict(scope)  # a body sees the outer scope, not the other way round
        if self._root is None:
            self._root = gp
        self._declare(gp, graph, scope, subgraph_path, parent)
        own: list[Node] = []
        for np_ in gp.node:
            node, outputs, body_attrs = self._node(np_, subgraph_path, parent)
            untyped = self._connect(node, np_, outputs, scope, parent)
            if node.op_type == "Constant" and node.outputs:
                _make_constant(node, np_, self.path, self.model_dir)
                untyped = True  # (it typed its output from its value)
            if untyped:
                _fill_missing_dtype(node)
            graph.nodes.append(node)
            own.append(node)
            if body_attrs is not None:
                if self.declared_only:  # bodies are left to inference, whose scoping rules are not repeated here
                    raise Undeclared(node.name)
                for attr_name, typ, attr in body_attrs:
                    for body in ([attr.g] if typ == _GRAPH else list(attr.graphs)):
                        # node.name holds the path
                        inner = self.build(body, graph, scope, f"{node.name}/{attr_name}/", parent=node)
                        if typ == _GRAPH:
                            node.body_nodes[attr_name] = inner
        if not subgraph_path:
            graph.outputs = [scope[text(o.name)] for o in gp.output if text(o.name) in scope]
        return own

    def _declare(self, gp: onnx.GraphProto, graph: Graph, scope: dict[str, Value], subgraph_path: str,
                 parent: Node | None) -> None:
        """gp's declared types, and its initializers and inputs in scope (the graph's inputs, at top level)."""
        types = self.types
        for infos in (gp.value_info, gp.output, gp.input):  # an input's own declaration wins
            types.update({vi.name if vi.name.__class__ is str else text(vi.name): vi.type for vi in infos})
        for init in gp.initializer:
            value = scope[text(init.name)] = self._initializer_value(init)
            value.parent = parent
        for vi in gp.input:
            # a body's input shadows an outer value of the same name; at top level an initializer may stand for it
            name = text(vi.name)
            if subgraph_path or name not in scope:
                value = self._value(name)
                value.is_graph_input = not subgraph_path
                value.parent = parent
                scope[name] = value
                if not subgraph_path:
                    graph.inputs.append(value)

    def _node(self, np_: onnx.NodeProto, subgraph_path: str, parent: Node | None
              ) -> tuple[Node, list[str], list | None]:
        """np_ as an IR node without its inputs and outputs; the names of its outputs; the attributes that hold
        its bodies (None: it has none)."""
        op_type = np_.op_type
        op_type = sys.intern(op_type if op_type.__class__ is str else text(op_type))
        domain = np_.domain
        if domain:
            domain = sys.intern(domain if domain.__class__ is str else text(domain))
            opset = self.opsets.get(_domain(domain))
        else:
            opset = self.default_opset
        outputs = np_.output[:]  # (a slice is the quickest copy protobuf makes)
        for oname in outputs:
            if oname.__class__ is not str:  # a name that is not UTF-8
                outputs = [text(o) for o in outputs]
                break
        own_name = np_.name
        if own_name.__class__ is not str:
            own_name = text(own_name)
        # raw: reports escape it
        name = own_name or generated_name(op_type, outputs[0] if outputs else "", self._explicit_names())
        attrs, bodies, body_attrs = _NO_ATTRS, _NO_BODIES, None
        if np_.attribute:
            attrs, bodies, body_attrs = self._attributes(np_, subgraph_path + name, op_type, domain, opset,
                                                         self._schemas)
        node = Node(subgraph_path + name, op_type, domain, attrs, [], [], opset, None, None, None, None,
                    subgraph_path, bodies, _NO_BODY_NODES if body_attrs is None else {}, parent, not own_name)
        # module scope: TorchScript names nodes "/encoder/layer.0/attention/Softmax"
        if own_name.startswith("/"):
            cut = own_name.rfind("/")
            if cut > 0:
                prefix = own_name[:cut]
                scope = self._scopes.get(prefix, _UNSEEN)  # (inline: a call per node was a tenth of the build)
                node.scope = self._module_scope(prefix) if scope is _UNSEEN else scope
        if np_.metadata_props:
            _attach_metadata(node, np_)
        return node, outputs, body_attrs

    def _module_scope(self, prefix: str) -> str | None:
        """The module path a TorchScript name's path prefix names ("/encoder/layer.0" -> "encoder.layer.0"), kept
        for the next node of the same prefix."""
        found = self._scopes[prefix] = ".".join(p for p in prefix.split("/")[1:] if p) or None
        return found

    def _connect(self, node: Node, np_: onnx.NodeProto, outputs: list[str], scope: dict[str, Value],
                 parent: Node | None) -> bool:
        """The node's inputs, read from scope, and its outputs, typed as the file declares them and put in scope;
        whether an output is left without a dtype."""
        ins = node.inputs
        get_scope = scope.get
        for iname in np_.input[:]:
            if not iname:
                ins.append(None)
                continue
            read = get_scope(iname if iname.__class__ is str else text(iname))
            if read is None:
                self._missing(node, text(iname))
            read.consumers.append(node)
            ins.append(read)
        outs = node.outputs
        get_type = self.types.get
        untyped = False
        for oname in outputs:
            if oname:
                tp = get_type(oname)
                if tp is not None:
                    tt = tp.tensor_type
                    value = Value(oname, _DTYPES[tt.elem_type], None, tt.shape if tt.HasField("shape") else None,
                                  node, None, False, parent)  # (a shape is read when asked: ir.Value.shape)
                else:
                    value = Value(oname, None, None, None, node, None, False, parent)
                if value.dtype is None:
                    untyped = True
                    if self.declared_only:
                        raise Undeclared(oname)
                elif self.declared_only and value._shape is None:
                    raise Undeclared(oname)
                scope[oname] = value
            else:
                value = Value("", producer=node, parent=parent)
                untyped = True
            outs.append(value)
        return untyped


    # Every attribute of every node passes here (the load's hot loop): its cases stay inline, not a call each.
    def _attributes(self, np_: onnx.NodeProto, node_name: str, op_type: str, domain: str, opset: int | None,  # noqa: C901
                    schemas: dict) -> tuple[dict, dict, list | None]:
        """The node's attributes (graphs aside), its GRAPH bodies by name, and every attribute that holds graphs.

        An attribute of the wrong type for the operator's schema (a string epsilon, an int list stash_type) makes
        the file invalid: the analyses read attributes as the schema types them, so checking here once keeps every
        reader simple. Unknown ops and attributes the schema does not list are left alone (custom domains,
        contrib ops).
        """
        key = (op_type, domain, opset)
        want_types = schemas.get(key)
        if want_types is None:
            want_types = schemas[key] = _schema_types(*key)
        attrs: dict[str, Any] = {}
        bodies: dict[str, Any] = _NO_BODIES
        body_attrs: list | None = None
        wrong = None
        for attr in np_.attribute:
            attr_name = attr.name
            if attr_name.__class__ is not str:
                attr_name = text(attr_name)
            typ = attr.type
            if typ == _GRAPH:
                if bodies is _NO_BODIES:
                    bodies = {}
                bodies[attr_name] = attr.g
                body_attrs = body_attrs or []
                body_attrs.append((attr_name, typ, attr))
            elif typ == _GRAPHS or attr.graphs:  # (graphs in an attribute of another type are walked too)
                body_attrs = body_attrs or []
                body_attrs.append((attr_name, typ, attr))
            if typ not in (_GRAPH, _GRAPHS):
                if attr.ref_attr_name:
                    value = _attr_value(attr)  # raises, as onnx.helper does
                elif typ == _INT:
                    value = attr.i
                elif typ == _INTS:
                    value = list(attr.ints)
                elif typ == _FLOAT:
                    value = attr.f
                elif typ == _TENSOR:
                    value = attr.t
                elif typ == _FLOATS:
                    value = list(attr.floats)
                else:
                    value = _attr_value(attr)
                attrs[attr_name] = value
            if wrong is None and want_types:
                want = want_types.get(attr_name)
                if want is not None and typ != want:
                    wrong = (attr_name, typ, want)
        if wrong is not None:
            attr_name, typ, want = wrong
            got = onnx.AttributeProto.AttributeType.Name(typ) if typ in _ATTR_TYPES else typ
            raise InputError(self.path, f"node '{node_name}' ({op_type}): attribute '{attr_name}' must be "
                                        f"{onnx.AttributeProto.AttributeType.Name(want)}, the file has {got}")
        return attrs, bodies, body_attrs

    def _missing(self, node: Node, iname: str) -> NoReturn:
        if node.subgraph_path and not self.resorted:
            raise ReadLater(iname)
        # Auditing around the gap would judge nodes by a dtype and a producer nobody can know; say so.
        raise InputError(self.path, f"the graph is invalid: node '{node.name}' ({node.op_type}) reads "
                                    f"'{iname}', which no graph input, initializer or earlier node defines "
                                    "(a cycle, nodes out of topological order, or a missing value)")

    def _value(self, name: str) -> Value:
        value = Value(name=name)
        tp = self.types.get(name)
        if tp is not None and tp.HasField("tensor_type"):
            tt = tp.tensor_type
            value.dtype = _dtype_name(tt.elem_type)
            if tt.HasField("shape"):
                value.shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        return value

    def _initializer_value(self, init: onnx.TensorProto) -> Value:
        name = text(init.name)
        dims = tuple(init.dims)
        what = f"initializer '{name}'"
        count = element_count(dims, self.path, what)
        loader = tensor_loader(init, self.path, self.model_dir, what, noted=self._noted, count=count)
        origin = what + " (external data)" if init.data_location == onnx.TensorProto.EXTERNAL else what
        return Value(name, _DTYPES[init.data_type], None, dims, const_loader=loader, const_origin=origin,
                     const_size=count)


def _make_constant(node: Node, np_: onnx.NodeProto, path: str, model_dir: Path) -> None:
    out = node.outputs[0]
    attributes = np_.attribute
    attr = attributes[0] if attributes else None
    if attr is None:
        return
    loader: Callable[[], np.ndarray]
    if attr.name == "value":
        loader = tensor_loader(attr.t, path, model_dir, f"Constant node '{node.name}'")
        out.dtype = out.dtype or _dtype_name(attr.t.data_type)
    elif attr.name in ("value_float", "value_floats"):
        loader = lambda: np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.float32)  # noqa: E731
        out.dtype = out.dtype or "fp32"
    elif attr.name in ("value_int", "value_ints"):
        loader = lambda: np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.int64)  # noqa: E731
        out.dtype = out.dtype or "int64"
    else:
        return
    out.const_loader = loader
    out.const_origin = f"Constant node '{node.name}'"
    out.const_size = element_count(attr.t.dims, path, out.const_origin) if attr.name == "value" else None


def _attach_metadata(node: Node, np_: onnx.NodeProto) -> None:
    """Module scope and Python source line from the dynamo exporter's node metadata (the name gave the scope so far).

    The line is where the model was exported from: a related location when that file is in this repository, never
    the finding's place (an ONNX finding is in the model, at the node). torch_graph places a PyTorch input's nodes
    by their lines instead."""
    meta = {text(p.key): text(p.value) for p in np_.metadata_props}
    scopes = re.findall(r"'([^']*)'", meta.get(_META_SCOPE, ""))
    if len(scopes) >= 2:
        # ['', 'encoder', 'encoder.layer.0', ..., 'layer_norm']: full dotted module paths, then the op itself
        node.scope = scopes[-2] or None
    stack = meta.get(_META_STACK, "")
    frame = user_frame(stack) if stack else None
    if frame is not None and in_repository(frame[0]):
        node.recorded_at = frame


_ATTR_TYPES = set(onnx.AttributeProto.AttributeType.values())


def _schema_types(op_type: str, domain: str, opset: int | None) -> dict[str, int]:
    """Attribute name -> AttributeProto type from the operator's schema at the model's opset; {} if none is known."""
    try:
        schema = onnx.defs.get_schema(op_type, opset if opset is not None and 0 < opset < 1 << 31 else 1 << 30,
                                      _domain(domain))
    except Exception:  # an op no schema knows: a custom domain, a typo, a newer opset
        return {}
    # (onnx's stub declares AttrType a plain class; it is an IntEnum)
    return {name: int(a.type) for name, a in schema.attributes.items()  # type: ignore[call-overload]
            if int(a.type) in _ATTR_TYPES}  # type: ignore[call-overload]


def _attr_value(attr: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return value
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


class _DtypeNames(dict):
    """elem_type -> _dtype_name(elem_type), filled on first use."""

    def __missing__(self, elem_type: int) -> str | None:
        name = self[elem_type] = _dtype_name(elem_type)
        return name


_UNSEEN: Any = object()  # a module-scope prefix not met yet (its scope may be None)
_NO_ATTRS: dict = {}  # shared by every node without attributes (nothing writes to a node's attrs)


@functools.cache
def _dtype_name(elem_type: int) -> str | None:
    fmt = format_of_onnx_type(elem_type)
    if fmt is not None:
        return fmt.name
    if elem_type == 0:
        return None
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return None


_DTYPES = _DtypeNames()


def _fill_missing_dtype(node: Node) -> None:
    """Give outputs that shape inference left untyped the dtype their producer implies (nodes come in graph
    order, so the inputs have theirs already)."""
    for out in node.outputs:
        if out.dtype is not None:
            continue
        if node.op_type == "Cast" and "to" in node.attrs:
            out.dtype = _dtype_name(node.attrs["to"])
        elif node.op_type == "CastLike" and (like := node.input(1)) is not None:
            out.dtype = like.dtype
        else:
            out.dtype = next((v.dtype for v in node.inputs if v is not None and v.dtype), None)
