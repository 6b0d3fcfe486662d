"""OpenVINO 2026.4.1's fp16 compression (`ov.save_model(model, path, compress_to_fp16=True)`, and the GPU plugin's
float16 inference precision), and the Python that keeps nodes of an ONNX model in float32 through it.

Read in openvinotoolkit/openvino src/common/transformations: fp16_compression/mark_subgraphs_to_keep_in_mixed_precision.cpp
(what it keeps in float32 by itself: runtime/openvino_gpu.py models those marks), common_optimizations/
compress_float_constants.cpp @02049b1f (a constant is compressed unless marked or ≥ 75 % of its values lie beyond
float16; compressed values are clamped to ±65504), convert_precision.cpp @024f14f1 (a marked node is skipped;
fuse_type_to_convert turns an unmarked Convert to float32 into one to float16), rt_info/disable_precision_conversion.hpp
@018fdc9b (DisablePrecisionConversion, `ov::disable_conversion(node, f16)` in C++; the legacy DisableFP16Compression
"precise_0" is deprecated). Measured with the openvino wheel 2026.4.1 (tests/test_keep_list_openvino.py runs the
printed snippet again):

- Python has no binding for DisablePrecisionConversion; `rt_info["DisablePrecisionConversion"]` (or "..._0") set from
  Python is a plain string and does nothing.
- `rt_info["precise_0"] = ""` set from Python is written to the IR as `<attribute name="DisablePrecisionConversion"
  version="0" value="dynamic:f16"/>`, but only after `save_model(compress_to_fp16=True)` has compressed the weights:
  a marked Const still comes out float16. Read back with `core.read_model`, the IR attribute is the real one, and a
  second `save_model(compress_to_fp16=True)` keeps a marked Const float32. So the snippet marks, saves the IR
  uncompressed, reads it back, checks every mark held, and saves it compressed.
- CompressFloatConstants: 1e5 and -1e9 become ±65504, 1e-12 becomes 0, 3e-8 the subnormal 5.96e-8; a constant with 9
  of its 12 values beyond float16 stays float32 (8 of 12: compressed); a scalar float16 cannot hold (0.1, 0.1768,
  2.1) stays float32 in the IR, 0.5 and 2.0 and vectors are compressed. (The GPU plugin converts what the IR keeps
  float32 again unless it is marked: the converter model rounds every unmarked constant.)
- On the CPU plugin a layer so marked runs float32 under the bfloat16 hint (runtimePrecision f32).
- `core.read_model(onnx)` makes each ONNX node one layer named after it, or a few (Gemm: MatMul and Add; a
  LayerNormalization: MVN, Multiply, Add) whose last one carries the node's output tensor names; the layer that
  makes a graph output is named after the output. Layers are found by those tensor names, which hold any node name.
"""

from __future__ import annotations

from ..ir import Graph
from .base import Clamp, Converter, KeepArgs

__all__ = ["CONVERTER", "VERSION", "ir_path", "paste"]

VERSION = "2026.4.1"  # the one release modelled here
_TITLE = f"OpenVINO {VERSION}'s fp16 compression"


def _blocked(graph: Graph, target: str) -> dict[int, str]:
    from ..runtime.openvino_gpu import kept_in_f32

    why = (f"kept in float32 by {_TITLE} itself (MarkSugraphsToKeepInMixedPrecision: a division guarded by an eps "
           "≤ 6.1e-5, an Exp summed by a reduction, Sin/Cos of positions, and what those reach)")
    return dict.fromkeys(kept_in_f32(graph), why)


CONVERTER = Converter(
    name="openvino", title=_TITLE, targets=("fp16",), block_list_name="mixed-precision marks", op_block_list=(),
    clamps={"fp16": Clamp(0.0, 65504.0, "OpenVINO's fp16 compression clamps the constants it compresses to ±65504 "
                                        "(CompressFloatConstants)", by=f"{_TITLE} (CompressFloatConstants)")},
    upcast="turns it into a Cast to float16 (ConvertPrecision's fuse_type_to_convert)", extra_blocked=_blocked,
    source=f"openvino src/common/transformations (fp16_compression/, compress_float_constants.cpp, "
           f"convert_precision.cpp), openvino {VERSION}",
    initializers="per-reader")


def ir_path(args: KeepArgs) -> str:
    """Where the snippet writes the IR (its .bin beside it): the model's file name with .fp16.xml."""
    out = args.out
    return out if args.out_path is not None else out[:-len(".onnx")] + ".xml"


def paste(args: KeepArgs) -> str:
    """Python that reads the ONNX model, marks the listed nodes' layers and their float weights, and saves the IR
    with compress_to_fp16=True (the route measured to work in 2026.4.1: see the module's docstring)."""
    keep = "{" + ", ".join(f"{n!r}: [{', '.join(map(repr, outs))}]" for n, outs in zip(args.nodes, args.outputs)) + "}"
    lines = [f"OUTPUT_PATH = {ir_path(args)!r}  # where the IR is written (.xml, its .bin beside it): set it to your own path",
             "import os",
             "import tempfile",
             "",
             "import openvino as ov",
             "",
             "# the nodes to keep in float32, each with the tensors it makes: OpenVINO names a layer's outputs after them",
             f"KEEP = {keep}",
             "",
             "",
             "def all_ops(model):",
             "    for op in model.get_ordered_ops():",
             "        yield op",
             "        yield from body_ops(op)",
             "",
             "",
             "def body_ops(op):  # an If's two bodies, a Loop's (a Scan is a TensorIterator)",
             "    kind = op.get_type_name()",
             "    bodies = [op.get_then_body(), op.get_else_body()] if kind == 'If' else \\",
             "        [op.get_function()] if kind in ('Loop', 'TensorIterator') else []",
             "    for body in bodies:",
             "        yield from all_ops(body)",
             "",
             "",
             "core = ov.Core()",
             f"model = core.read_model({args.model!r})",
             "makers = {name: op for op in all_ops(model) if op.get_type_name() != 'Result'",
             "          for out in op.outputs() for name in out.get_names()}",
             "missing = [node for node, tensors in KEEP.items() if not any(t in makers for t in tensors)]",
             "if missing:",
             "    raise SystemExit(f'OpenVINO made no layer of {missing}: the list cannot be applied to this model')",
             "# the layer that makes each tensor, the unnamed layers OpenVINO made the same node into, their float weights",
             "todo, keep = [makers[t] for tensors in KEEP.values() for t in tensors if t in makers], {}",
             "while todo:",
             "    op = todo.pop()",
             "    if op.get_name() in keep or not any(out.get_element_type().is_real() for out in op.outputs()):",
             "        continue",
             "    keep[op.get_name()] = op",
             "    todo += body_ops(op)  # an If or a Loop kept whole: its bodies too",
             "    for source in (i.get_source_output() for i in op.inputs()):",
             "        maker = source.get_node()",
             "        if maker.get_type_name() == 'Constant' or not source.get_names() and maker.get_type_name() != 'Parameter':",
             "            todo.append(maker)",
             "for op in keep.values():",
             "    op.get_rt_info()['precise_0'] = ''  # written to the IR as DisablePrecisionConversion",
             "with tempfile.TemporaryDirectory() as folder:",
             "    # compress_to_fp16 compresses the weights before that mark becomes the attribute it honours: save the IR",
             "    # uncompressed, read it back (the attribute itself now), then compress",
             "    marked = os.path.join(folder, 'marked.xml')",
             "    ov.save_model(model, marked, compress_to_fp16=False)",
             "    model = core.read_model(marked)",
             "    held = sum('DisablePrecisionConversion_0' in op.get_rt_info() for op in all_ops(model))",
             "    if held != len(keep):",
             "        raise SystemExit(f'{len(keep)} layers marked, {held} keep the mark in the IR: this OpenVINO '",
             "                         'does not read it as openvino 2026.4.1 does')",
             "    ov.save_model(model, OUTPUT_PATH, compress_to_fp16=True)"]
    return "\n".join(lines)
