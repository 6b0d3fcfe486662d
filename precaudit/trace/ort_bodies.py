"""If/Loop/Scan bodies rewritten for a segment: float32 types, and for the emulated copy renamed and rounded.

The emulated copy of a body gets the emu:: prefix on every name it defines and a Cast pair after every float output
inside it; the outer values a body reads by name are fed to the segment's session like any other input.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..converters import Clamp
from ..ir import Node, Value
from .ort_eligible import refusal
from .ort_nodes import NARROW, ROUND_TO, float32_attrs, inference_inputs, reference_array, round_trip
from .plan import Plan
from .rounding import round_into

__all__ = ["BodyRewriter"]

# What _body yields for each nested body it needs: (the body, its nodes in the IR, the outer names it may read).
_Nested = tuple[onnx.GraphProto, list[Node], dict[str, str]]


class BodyRewriter:
    """Rewrites the bodies of a plan's control-flow nodes for either run."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def bodies(self, node: Node, outer: dict[str, str], emulated: bool) -> dict[str, onnx.GraphProto]:
        """A node's If/Loop/Scan bodies for one of the runs: float32 types; emulated, also renamed and rounded.

        outer maps each outer name a body reads to the name that value has in the segment for this run.
        Nested bodies are rewritten through an explicit stack of _body generators, not by recursion: each
        generator yields the (body, nodes, outer names) of a nested body it needs and is sent the rewritten
        graph back, in the order a recursive rewrite would make them.
        """
        built = {}
        for key, body in node.bodies.items():
            stack = [self._body(body, node.body_nodes.get(key, []), outer, emulated)]
            result: onnx.GraphProto | None = None
            while stack:
                try:
                    nested = stack[-1].send(result)
                except StopIteration as done:
                    stack.pop()
                    result = done.value
                    continue
                stack.append(self._body(*nested, emulated))
                result = None
            built[key] = cast(onnx.GraphProto, result)  # the stack empties as the outermost body returns
        return built

    def _body(self, body: onnx.GraphProto, inner: list[Node], outer: dict[str, str],
              emulated: bool) -> Generator[_Nested, onnx.GraphProto | None, onnx.GraphProto]:
        """One body rewritten (a generator: it yields each nested body it needs, see bodies); inner is the IR's copy
        of the body, node for node."""
        mine = {v.name for v in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}

        def name(n: str) -> str:
            if not n:
                return n
            if n in mine:
                return f"emu::{n}" if emulated else n
            if n not in outer:
                raise ValueError(f"a body reads '{n}', which precaudit cannot place in the graph")
            return outer[n]

        nested_outer = {**outer, **{n: name(n) for n in mine}}
        out = onnx.GraphProto(name=body.name)
        for source, target in ((body.input, out.input), (body.output, out.output)):
            for vi in source:
                widened = target.add()
                widened.CopyFrom(vi)
                widened.name = name(vi.name)
                if widened.type.tensor_type.elem_type in NARROW:
                    widened.type.tensor_type.elem_type = TensorProto.FLOAT
        consts = {v.name: v for n in inner for v in n.inputs if v is not None and v.is_const}
        for t in body.initializer:
            out.initializer.append(numpy_helper.from_array(self._initializer(t, consts.get(t.name), emulated),
                                                           name(t.name)))
        if len(inner) != len(body.node):
            raise ValueError(f"a body of {len(body.node)} nodes has {len(inner)} in precaudit's graph")
        for proto, node in zip(body.node, inner):
            attrs = self._attrs(node, emulated)
            for key, nested in node.bodies.items():
                attrs[key] = yield nested, node.body_nodes.get(key, []), nested_outer
            outputs = [name(o) for o in proto.output]
            rounded = []
            for k, o in enumerate(node.outputs):
                fmt = self.plan.held(o) if emulated and o.name else None
                if fmt is not None and fmt.name in ROUND_TO:
                    rounded.append((f"raw::{outputs[k]}", outputs[k], ROUND_TO[fmt.name]))
                    outputs[k] = f"raw::{outputs[k]}"
            inputs = inference_inputs(node, [name(i) for i in proto.input])
            out.node.append(helper.make_node(proto.op_type, inputs, outputs, domain=proto.domain, **attrs))
            for source, target, narrow in rounded:
                out.node.extend(round_trip(source, target, narrow))
        return out

    def _initializer(self, t: onnx.TensorProto, value: Value | None, emulated: bool) -> np.ndarray:
        """A body's initializer as the run reads it: the emulated copy converted where its readers read it so."""
        array = reference_array(numpy_helper.to_array(t))
        if emulated and value is not None:
            converted, clamp = self._const(value)
            if converted:
                array = np.asarray(round_into(clamp.array(array) if clamp is not None else array,
                                              self.plan.held(value)))
        return array

    def _attrs(self, node: Node, emulated: bool) -> dict:
        """A body node's float32 attributes; emulated, refused where onnxruntime cannot emulate it, and with the
        tensor of a Constant the --converter clamps clamped."""
        plan = self.plan
        if emulated:
            outputs_fmt = [plan.held(o) if o.name else None for o in node.outputs]
            input_formats = [None if v is None else plan.held(v) for v in node.inputs]
            reason = refusal(node, plan.spec(node), input_formats, outputs_fmt)
            if reason is not None:
                raise ValueError(f"inside its body, {reason}")
        attrs = float32_attrs(node)
        if emulated and node.op_type == "Constant" and isinstance(attrs.get("value"), TensorProto):
            clamp = self._const(node.outputs[0])[1] if node.outputs and node.outputs[0].is_const else None
            if clamp is not None:  # the --converter clamps a Constant's tensor
                attrs["value"] = numpy_helper.from_array(clamp.array(numpy_helper.to_array(attrs["value"])),
                                                         attrs["value"].name)
        return attrs

    def _const(self, v: Value) -> tuple[bool, Clamp | None]:
        """How a body's emulated copy holds a constant of the body, which one name serves every reader: converted if
        any reader reads it converted (Plan.const_read), with the clamp such a read applies."""
        reads = [self.plan.const_read(v, reader) for reader in v.consumers] or [(True, None)]
        return any(c for c, _ in reads), next((clamp for c, clamp in reads if c and clamp is not None), None)
