"""onnxruntime 1.32.0's transformers converter, and Olive 0.13.0's OnnxFloatToFloat16 pass, which calls it.

Read from `onnxruntime/transformers/float16.py` and `onnx_model.py` of the onnxruntime 1.32.0 wheel:

- ``DEFAULT_OP_BLOCK_LIST``: 28 ops — onnxconverter-common's without ``Resize``, with ``TreeEnsemble``; a list
  given as ``op_block_list`` replaces it. ``ALWAYS_FLOAT_INPUTS`` keeps Resize's scales and GroupNorm's
  gamma/beta float32 (``force_fp16_inputs`` overrides it).
- ``convert_np_to_float16(min_positive_val=5.96e-08, max_finite_val=65504.0)``: converted constants are clamped
  into the float16 range: 1e-12 becomes the smallest subnormal, -1e9 and finfo(float32).min become -65504.
  An initializer is converted when a node outside the block lists reads it; a ``Constant``'s value when the
  Constant is not blocked.
  A ``Constant`` a blocked node reads is converted all the same unless it is blocked too
  (``convert_float_to_float16`` queues every attribute of a node outside the block lists), and a
  ``Cast(to=float32)`` is put before the reader: 9.79e7 is read as 65504. A blocked ``Constant`` read by a blocked
  node stays float32 through ``OnnxModel.convert_float_to_float16`` (its ``remove_cascaded_cast_nodes`` drops
  the Cast pair float16.py puts between them; float16.py alone reads it through float16: inf).
- A ``Cast(to=float32)`` outside the block lists is rewritten to ``to=float16``; a blocked one keeps
  ``to=float32``, and its output is cast to float16 for a reader outside the block lists (an int32 accumulator of
  1e5 is inf there: keep the reader too).
- ``OnnxModel.convert_float_to_float16`` defaults ``keep_io_types=True`` and runs symbolic shape inference.

Olive 0.13.0 (`olive/passes/onnx/float16_conversion.py`) calls ``OnnxModel.convert_float_to_float16`` with its
own defaults ``min_positive_val=1e-7``, ``max_finite_val=1e4``, ``keep_io_types=False``: onnxruntime's block
list with onnxconverter-common's clamp.
"""

from __future__ import annotations

from .base import CONTROL_FLOW_CAVEAT, Clamp, Converter, KeepArgs, py_list

__all__ = ["CONVERTER", "DEFAULT_OP_BLOCK_LIST", "OLIVE", "paste", "paste_olive"]

DEFAULT_OP_BLOCK_LIST = (
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "TreeEnsemble", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum",
    "Min", "Max", "Upsample",
)

VERSION, OLIVE_VERSION = "1.32.0", "0.13.0"  # the one release of each modelled here
ALWAYS_FLOAT_INPUTS = {"Resize": (2,), "GroupNorm": (1, 2), "SkipGroupNorm": (1, 2)}  # float16.py's, as it is
_UPCAST = "rewrites it to Cast(to=float16)"
CONVERTER = Converter(
    name="onnxruntime", title=f"onnxruntime {VERSION}'s float16 converter", targets=("fp16",),
    block_list_name="default op_block_list", op_block_list=DEFAULT_OP_BLOCK_LIST,
    clamps={"fp16": Clamp(5.96e-08, 65504.0, "onnxruntime's converter clamps the constants it converts into "
                                             "[5.96e-08, 65504] (min_positive_val, max_finite_val)",
                          by=f"onnxruntime {VERSION}'s float16 converter (max_finite_val=65504)")},
    upcast=_UPCAST, source=f"onnxruntime/transformers/float16.py, onnxruntime {VERSION}",
    float_inputs=ALWAYS_FLOAT_INPUTS,
    control_flow=CONTROL_FLOW_CAVEAT.format(who=f"onnxruntime {VERSION}'s OnnxModel.convert_float_to_float16"))

OLIVE = Converter(
    name="olive", title=f"Olive {OLIVE_VERSION}'s OnnxFloatToFloat16 (onnxruntime {VERSION}'s converter)",
    targets=("fp16",),
    block_list_name="default op_block_list", op_block_list=DEFAULT_OP_BLOCK_LIST,
    clamps={"fp16": Clamp(1e-7, 1e4, "Olive's OnnxFloatToFloat16 clamps the constants it converts into [1e-7, 1e4] "
                                     "(its min_positive_val, max_finite_val defaults)",
                        by=f"Olive {OLIVE_VERSION}'s OnnxFloatToFloat16 (max_finite_val=1e4)")},
    upcast=_UPCAST, source=f"olive/passes/onnx/float16_conversion.py, olive-ai {OLIVE_VERSION}",
    float_inputs=ALWAYS_FLOAT_INPUTS,
    control_flow=CONTROL_FLOW_CAVEAT.format(who=f"onnxruntime {VERSION}'s OnnxModel.convert_float_to_float16, which "
                                                "Olive calls"))


def paste(args: KeepArgs) -> str:
    """OnnxModel.convert_float_to_float16: the entry point that keeps a value passed between two kept nodes in
    float32. float16.convert_float_to_float16 alone casts every kept node's output to float16 and back to float32
    before the next kept node (Cast pairs only OnnxModel's remove_cascaded_cast_nodes removes): the value is
    rounded to float16 after all, and an overflow the list was to prevent comes back (checked with onnxruntime
    1.32.0 on the FFN-overflow model of tests/test_keep_list.py: NaN output through float16.py, finite through
    OnnxModel)."""
    kwargs = []
    if args.op_types:
        kwargs.append(f"    op_block_list=float16.DEFAULT_OP_BLOCK_LIST + {py_list(args.op_types)},  # yours "
                      "replaces the default")
    kwargs.append(f"    node_block_list={py_list(args.nodes)},")
    lines = [args.output_line(),
             "import onnx",
             *(["from onnxruntime.transformers import float16"] if args.op_types else []),
             "from onnxruntime.transformers.onnx_model import OnnxModel",
             "",
             args.load() if args.in_memory else
             f"model = onnx.load({args.model!r}){'  # with its external data' if args.large else ''}",
             *args.naming(),
             "onnx_model = OnnxModel(model)",
             "onnx_model.convert_float_to_float16(",
             ("    keep_io_types=True,  # the graph inputs' range needs float32 (their readers are kept too)"
              if args.keep_io else
              "    keep_io_types=False,  # OnnxModel's default (True) keeps float32 graph inputs and outputs"),
             *kwargs,
             ")",
             "onnx_model.save_model_to_file(OUTPUT_PATH"
             f"{', use_external_data_format=True' if args.large else ''})",
             "# not float16.convert_float_to_float16(model, ...) alone: it rounds what passes between two kept",
             "# nodes to float16 and back (OnnxModel removes those Cast pairs: remove_cascaded_cast_nodes)"]
    return "\n".join(lines)


def paste_olive(args: KeepArgs) -> str:
    """The pass's JSON configuration (op_block_list left out: its default is onnxruntime's list)."""
    import json

    config: dict = {"type": "OnnxFloatToFloat16", "node_block_list": args.nodes}
    if args.keep_io:
        config["keep_io_types"] = True
    if args.op_types:
        config["op_block_list"] = [*DEFAULT_OP_BLOCK_LIST, *args.op_types]
    if args.large:
        config["save_as_external_data"] = True
    # JSON only, to paste into an Olive config: the note on unnamed nodes is the keep-list report's (a comment
    # appended here made the snippet no JSON)
    return json.dumps({"passes": {"fp16": config}}, indent=2)
