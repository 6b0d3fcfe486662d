"""Load an ONNX model into the IR without reading weights the audit does not need."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnx.inliner

from ..dtypes import format_of_onnx_type
from ..errors import InputError
from ..files import open_regular
from ..ir import Graph, Node, Value
from .onnx_data import element_count, tensor_loader, text
from .source import user_frame

__all__ = ["load_onnx"]

# Keys the torch dynamo exporter writes into node.metadata_props.
_META_SCOPE = "pkg.torch.onnx.name_scopes"
_META_STACK = "pkg.torch.onnx.stack_trace"


def load_onnx(path: str) -> Graph:
    """Parse the model file, inline its local functions, infer types and build the IR."""
    model = _read_model(path)
    model_dir = Path(path).resolve().parent
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:  # an inliner failure should not hide the rest of the graph
            raise InputError(path, f"cannot inline model-local functions: {exc}") from exc
    model = _infer_shapes(model)
    opsets = {_domain(text(imp.domain)): imp.version for imp in model.opset_import}
    builder = _Builder(path, model_dir, opsets)
    graph = Graph(path=path, producer_name=text(model.producer_name))
    builder.build(model.graph, graph, scope={}, subgraph_path="")
    _fill_missing_dtypes(graph)
    graph.exporter = _exporter(model)
    return graph


def _domain(name: str) -> str:
    """"ai.onnx" and "" both name the default domain; imports and nodes may spell it either way."""
    return "" if name in ("", "ai.onnx") else name


_WEIGHT_BYTES = 1 << 16


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with inferred types and shapes, or as it is when inference fails.

    Shape inference copies the whole model in and out; the weights' bytes are taken out first (their dims are
    all it reads of them: shapes it reads from data, a Reshape's target say, are small) and put back after.
    """
    weights = {init.name: init.raw_data for init in model.graph.initializer if len(init.raw_data) > _WEIGHT_BYTES}
    for init in model.graph.initializer:
        if init.name in weights:
            init.ClearField("raw_data")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model  # types then come from the graph's own annotations and _fill_missing_dtypes
    for init in inferred.graph.initializer:
        if init.name in weights:
            init.raw_data = weights[init.name]
    return inferred


def _exporter(model: onnx.ModelProto) -> str:
    """Which exporter wrote the model; the dynamo exporter leaves pkg.torch.onnx metadata on its nodes."""
    if any(text(p.key).startswith("pkg.torch.onnx") for n in model.graph.node[:50] for p in n.metadata_props):
        return "torch-dynamo"
    if model.producer_name == "pytorch":
        return "torch-torchscript"
    return text(model.producer_name)


# protobuf cannot parse a message above 2 GiB: a bigger file is not a model (its weights belong in external data)
_MAX_MODEL_BYTES = 2 << 30


def _read_model(path: str) -> onnx.ModelProto:
    with open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size > _MAX_MODEL_BYTES:
            raise InputError(path, "is larger than 2 GiB, the most an ONNX file can hold (weights above that live "
                                   "in external data files)")
        data = fh.read()
    try:
        return _parse_model(data)
    except InputError as exc:
        raise InputError(path, exc.problem) from None
    except Exception as exc:
        raise InputError(path, f"not a readable ONNX model ({type(exc).__name__}: {_first_line(exc)})") from None


def _parse_model(data: bytes) -> onnx.ModelProto:
    model = onnx.load_model_from_string(data)
    if not model.HasField("graph") or not model.graph.node and not model.graph.input:
        raise InputError(None, "not an ONNX model: the file parses but holds no graph")
    return model


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else "unknown error"


class _Builder:
    """Walks a GraphProto (and the bodies of If/Loop/Scan) into one flat IR graph."""

    def __init__(self, path: str, model_dir: Path, opsets: dict[str, int]):
        self.path = path
        self.model_dir = model_dir
        self.opsets = opsets
        self.types: dict[str, onnx.TypeProto] = {}
        self._schemas: dict[tuple, dict[str, int]] = {}

    def build(self, gp: onnx.GraphProto, graph: Graph, scope: dict[str, Value], subgraph_path: str,
              parent: Node | None = None) -> list[Node]:
        """Add gp's nodes (and their bodies' nodes) to graph; gp's own nodes, in order."""
        scope = dict(scope)  # a body sees the outer scope, not the other way round
        for vi in [*gp.value_info, *gp.output, *gp.input]:  # an input's own declaration wins
            self.types[text(vi.name)] = vi.type
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
        own = []
        for np_ in gp.node:
            node = self._node(np_, scope, subgraph_path)
            node.parent = parent
            for out in node.outputs:
                out.parent = parent
            graph.nodes.append(node)
            own.append(node)
            for attr in np_.attribute:
                for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    # node.name holds the path
                    inner = self.build(body, graph, scope, f"{node.name}/{text(attr.name)}/", parent=node)
                    if attr.type == onnx.AttributeProto.GRAPH:
                        node.body_nodes[text(attr.name)] = inner
        if not subgraph_path:
            graph.outputs = [scope[text(o.name)] for o in gp.output if text(o.name) in scope]
        return own

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
        value = Value(name=text(init.name), dtype=_dtype_name(init.data_type), shape=tuple(init.dims))
        what = f"initializer '{value.name}'"
        value.const_size = element_count(init.dims, self.path, what)
        external = init.data_location == onnx.TensorProto.EXTERNAL
        value.const_origin = what + (" (external data)" if external else "")
        value.const_loader = tensor_loader(init, self.path, self.model_dir, what)
        return value

    def _check_attributes(self, np_: onnx.NodeProto, node: Node) -> None:
        """An attribute of the wrong type (a string epsilon, an int list stash_type) makes the file invalid.

        The analyses read attributes as the operator schema types them; checking here once keeps every reader
        simple. Unknown ops and attributes the schema does not list are left alone (custom domains, contrib ops).
        """
        key = (node.op_type, node.domain, node.opset)
        if key not in self._schemas:
            self._schemas[key] = _schema_types(*key)
        types = self._schemas[key]
        for attr in np_.attribute:
            want = types.get(text(attr.name))
            if want is not None and attr.type != want:
                got = onnx.AttributeProto.AttributeType.Name(attr.type) if attr.type in _ATTR_TYPES else attr.type
                raise InputError(self.path, f"node '{node.name}' ({node.op_type}): attribute '{text(attr.name)}' must be "
                                            f"{onnx.AttributeProto.AttributeType.Name(want)}, the file has {got}")

    def _node(self, np_: onnx.NodeProto, scope: dict[str, Value], subgraph_path: str) -> Node:
        attrs = {text(a.name): _attr_value(a) for a in np_.attribute
                 if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}
        op_type, domain = text(np_.op_type), text(np_.domain)
        outputs = [text(o) for o in np_.output]
        name = text(np_.name) or f"{op_type}_{outputs[0] if outputs else ''}"  # raw: reports escape it
        node = Node(name=subgraph_path + name, op_type=op_type, domain=domain, attrs=attrs,
                    opset=self.opsets.get(_domain(domain)), subgraph_path=subgraph_path)
        self._check_attributes(np_, node)
        _attach_source(node, np_)
        node.bodies = {text(a.name): a.g for a in np_.attribute if a.type == onnx.AttributeProto.GRAPH}
        for iname in map(text, np_.input):
            if not iname:
                node.inputs.append(None)
                continue
            value = scope.get(iname)
            if value is None:
                # Auditing around the gap would judge nodes by a dtype and a producer nobody can know; say so.
                raise InputError(self.path, f"the graph is invalid: node '{node.name}' ({node.op_type}) reads "
                                            f"'{iname}', which no graph input, initializer or earlier node defines "
                                            "(a cycle, nodes out of topological order, or a missing value)")
            value.consumers.append(node)
            node.inputs.append(value)
        for oname in outputs:
            value = self._value(oname) if oname else Value(name="")
            value.producer = node
            node.outputs.append(value)
            if oname:
                scope[oname] = value
        if op_type == "Constant" and node.outputs:
            _make_constant(node, np_, self.path, self.model_dir)
        return node


def _make_constant(node: Node, np_: onnx.NodeProto, path: str, model_dir: Path) -> None:
    out = node.outputs[0]
    attr = next((a for a in np_.attribute), None)
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


def _attach_source(node: Node, np_: onnx.NodeProto) -> None:
    """Module scope and Python source line, from exporter metadata or the node name."""
    meta = {text(p.key): text(p.value) for p in np_.metadata_props}
    scopes = re.findall(r"'([^']*)'", meta.get(_META_SCOPE, ""))
    if len(scopes) >= 2:
        # ['', 'encoder', 'encoder.layer.0', ..., 'layer_norm']: full dotted module paths, then the op itself
        node.scope = scopes[-2] or None
    elif (own := text(np_.name)).startswith("/") and own.count("/") > 1:
        # TorchScript exporter names nodes "/encoder/layer.0/attention/Softmax"
        node.scope = ".".join(p for p in own.split("/")[1:-1] if p) or None
    frame = user_frame(meta.get(_META_STACK, ""))
    if frame is not None:
        node.source_file, node.source_line = frame


_ATTR_TYPES = set(onnx.AttributeProto.AttributeType.values())


def _schema_types(op_type: str, domain: str, opset: int | None) -> dict[str, int]:
    """Attribute name -> AttributeProto type from the operator's schema at the model's opset; {} if none is known."""
    try:
        schema = onnx.defs.get_schema(op_type, opset if opset is not None and 0 < opset < 1 << 31 else 1 << 30,
                                      _domain(domain))
    except Exception:  # an op no schema knows: a custom domain, a typo, a newer opset
        return {}
    return {name: int(a.type) for name, a in schema.attributes.items() if int(a.type) in _ATTR_TYPES}


def _attr_value(attr: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return value
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


@functools.lru_cache(maxsize=None)
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


def _fill_missing_dtypes(graph: Graph) -> None:
    """Give values that shape inference left untyped the dtype their producer implies."""
    for node in graph.nodes:
        for out in node.outputs:
            if out.dtype is not None:
                continue
            if node.op_type == "Cast" and "to" in node.attrs:
                out.dtype = _dtype_name(node.attrs["to"])
            elif node.op_type == "CastLike" and node.input(1) is not None:
                out.dtype = node.inputs[1].dtype
            else:
                out.dtype = next((v.dtype for v in node.inputs if v is not None and v.dtype), None)
