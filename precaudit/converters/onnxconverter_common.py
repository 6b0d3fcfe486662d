"""onnxconverter-common 1.16.0: `onnxconverter_common.float16.convert_float_to_float16`.

Read from `onnxconverter_common/float16.py` of the 1.16.0 wheel (identical to microsoft/onnxconverter-common
@28b00d4, "version 1.17", unreleased):

- ``DEFAULT_OP_BLOCK_LIST``: 28 ops, unchanged since 1.12.2 (commit 814cdf4 added RandomUniformLike); kernels
  without float16, nothing for norms. A list given as ``op_block_list`` *replaces* it.
- ``convert_np_to_float16(min_positive_val=1e-7, max_finite_val=1e4)``: every converted float32 constant (an
  initializer no blocked node reads, a tensor attribute of a node that is not blocked: a ``Constant``'s value)
  has 0 < |v| < 1e-7 set to ±1e-7 and 1e4 < |v| < inf set to ±1e4; 0, ±inf and NaN stay.
- ``process_node_in_block_list`` / ``node_block_list``: exact ``node.name`` (and ``op_type``) matches, in every
  graph it converts (an If/Loop body too, unless its parent is blocked: ``get_next_level_graph``).
- Since 1.15 a ``Cast`` keeps its ``to`` while ``process_value_info`` retypes its output to float16: a
  ``Cast(to=float32)`` outside the block lists gives a model onnxruntime refuses to load. A blocked one keeps
  float32 and ``insert_cast16_after_node`` casts its output to float16 (a reader outside the lists reads that).
- A ``Constant`` a blocked node reads is converted (clamped) unless it is blocked itself; blocked, its output is
  cast to float16 all the same by ``insert_cast16_after_node`` (unclamped: 1e8 becomes inf), so no block list
  keeps a Constant node's value float32 (an initializer only blocked nodes read stays float32).
"""

from __future__ import annotations

from .base import CONTROL_FLOW_CAVEAT, Clamp, Converter, KeepArgs, py_list

__all__ = ["CONVERTER", "DEFAULT_OP_BLOCK_LIST", "paste"]

DEFAULT_OP_BLOCK_LIST = (
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Resize", "Range", "CumSum", "Min",
    "Max", "Upsample",
)

VERSION = "1.16.0"  # the one release modelled here
_TITLE = f"onnxconverter-common {VERSION}"

CONVERTER = Converter(
    name="onnxconverter-common", title=_TITLE, targets=("fp16",),
    block_list_name="default op_block_list", op_block_list=DEFAULT_OP_BLOCK_LIST,
    clamps={"fp16": Clamp(1e-7, 1e4, "onnxconverter-common clamps the constants it converts into [1e-7, 1e4] "
                                     "(min_positive_val, max_finite_val)",
                           by=f"{_TITLE} (max_finite_val=1e4)")},
    upcast="keeps its to=float32 but retypes its output to float16 (the converted model fails to load unless "
           "the Cast is in node_block_list)",
    source=f"onnxconverter_common/float16.py, {VERSION} (= microsoft/onnxconverter-common @28b00d4)",
    control_flow=CONTROL_FLOW_CAVEAT.format(who=_TITLE), initializers="no-blocked-reader", kept_constants=False)


def paste(args: KeepArgs) -> str:
    """Python that converts the model with the list kept in float32 (the default list kept too)."""
    ops = py_list(args.op_types)
    lines = [args.output_line(),
             *(["import os"] if args.large else []),
             "import onnx",
             "from onnxconverter_common import float16",
             "",
             args.load(),
             *args.naming(),
             "model = float16.convert_float_to_float16(",
             "    model,",
             f"    op_block_list=float16.DEFAULT_OP_BLOCK_LIST + {ops},  # a list of your own replaces the default",
             f"    node_block_list={py_list(args.nodes)},"]
    if args.keep_io:
        lines.append("    keep_io_types=True,  # the graph inputs' range needs float32 (their readers are kept too)")
    if args.large:
        lines.append("    disable_shape_infer=True,  # onnx.shape_inference cannot take a model over 2 GB")
    lines += [")", args.save()]
    return "\n".join(lines)
