"""What a converter model is: its block list, its clamp of the constants it converts, its Cast handling, and the
arguments a keep-list snippet gives it. The converters themselves are the modules beside this one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..dtypes import Format
from ..ir import Graph

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CONTROL_FLOW_CAVEAT", "PLAIN", "Clamp", "Converter", "KeepArgs", "py_list"]


# What blocking control flow does to a model written by onnxconverter-common and onnxruntime's converter (alike:
# the second is a fork of the first); {who} names the converter checked.
CONTROL_FLOW_CAVEAT = ("blocking an If/Loop/Scan or a node in its bodies writes a model onnxruntime refuses: the values "
                       "a body reads from outside are not cast (checked with {who} on tests/test_keep_list.py's If model)")


@dataclass(frozen=True)
class Clamp:
    """A converter's clamp of the constants it converts: 0 < |v| < min_positive → ±min_positive (modelopt: always
    +min_positive), |v| > max_finite (and finite) → ±max_finite; 0, ±inf and NaN stay."""

    min_positive: float
    max_finite: float
    words: str  # "onnxconverter-common clamps the constants it converts into [1e-7, 1e4] (...)", for eps sources
    by: str = ""  # who, as a message names it: "onnxconverter-common 1.16.0 (max_finite_val=1e4)"
    forms: tuple[str, ...] = ("initializer", "Constant node")  # which stored constants it applies to
    sign_kept: bool = True  # modelopt replaces a tiny negative by +smallest_subnormal

    def apply(self, value: float) -> float:
        magnitude = abs(value)
        if 0 < magnitude < self.min_positive:
            return self.min_positive if value > 0 or not self.sign_kept else -self.min_positive
        if self.max_finite < magnitude < float("inf"):
            return self.max_finite if value > 0 else -self.max_finite
        return value

    def applies_to(self, source: str) -> bool:
        """Whether a constant stored as `source` (a const_origin: "initializer 'w'", "Constant node 'c'") is clamped."""
        return source.removeprefix("the unnamed ").startswith(self.forms)  # (ir.shown_origin's unnamed Constant)

    def array(self, data: np.ndarray) -> np.ndarray:
        """apply() on every element of a float array (a float32 copy; the array itself is left alone)."""
        import numpy as np

        out = np.array(data, dtype=np.float32)
        magnitude = np.abs(out)
        tiny = (magnitude > 0) & (magnitude < self.min_positive)
        big = (magnitude > self.max_finite) & np.isfinite(magnitude)
        if tiny.any():
            low = np.float32(self.min_positive)
            out[tiny] = np.copysign(low, out[tiny]) if self.sign_kept else low
        if big.any():
            out[big] = np.copysign(np.float32(self.max_finite), out[big])
        return out


@dataclass(frozen=True)
class Converter:
    """One converter version's behaviour, as far as the dtypes and constants of the converted model go."""

    name: str  # as --converter / --for spell it
    title: str  # "onnxconverter-common 1.16.0": its name and the one version modelled (the module's VERSION)
    targets: tuple[str, ...]  # the dtypes it converts float32 to
    block_list_name: str  # "default op_block_list"
    op_block_list: tuple[str, ...] = ()  # op types kept in float32 by default
    clamps: dict[str, Clamp] = field(default_factory=dict)  # per target dtype
    upcast: str = ""  # what it does to a Cast(to=float32) outside the block list; "" keeps it (plain)
    # op types it keeps in float32 besides the list, worked out from the graph (modelopt: ops whose schema has no
    # float16 at the model's opset); and chains it fuses into an op that computes in float32
    extra_blocked: Callable[[Graph, str], dict[int, str]] | None = None
    source: str = ""
    # why blocking an If/Loop/Scan (or a node in its bodies) gives an invalid model, where it does
    control_flow: str = ""
    # which readers of a float32 initializer read it converted (see reads_converted): "no-blocked-reader"
    # (converted only when no blocked node reads it), "any-reader" (converted when some node outside the block
    # lists reads it, and then every reader reads the converted copy), "per-reader" (each reader its own copy)
    initializers: str = "any-reader"
    # a Constant node the block lists keep, read by a kept node: True, that node reads it in float32 (OnnxModel's
    # remove_cascaded_cast_nodes drops the float16 Cast pair the converter puts between the two); False, the
    # converter casts the Constant's output to float16 all the same (onnxconverter-common's
    # insert_cast16_after_node: 1e8 becomes inf), so no block list keeps a Constant node's value in float32
    kept_constants: bool = True
    # inputs it keeps float32 whatever it converts: op type -> input indices (onnxruntime's ALWAYS_FLOAT_INPUTS:
    # Resize's scales, which its schema takes as float32 only)
    float_inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def keeps_constant_nodes(self) -> bool:
        """Whether blocking a Constant node together with the nodes reading it keeps its value float32 for them (a
        keep-list then lists the Constant nodes a kept node reads; they are converted otherwise)."""
        return not self.plain and self.initializers != "per-reader" and self.kept_constants

    @property
    def plain(self) -> bool:
        return self.name == "plain"

    def keeps_input_float(self, op_type: str, index: int) -> bool:
        """Whether the converted model reads this input of an op_type node in float32: its default block list keeps
        the op, or it keeps that input float32 whatever it converts (float_inputs)."""
        return op_type in self.op_block_list or index in self.float_inputs.get(op_type, ())

    def applies(self, target: Format) -> bool:
        return not self.plain and target.name in self.targets

    def blocked(self, graph: Graph, target: Format) -> dict[int, str]:
        """id(node) → why the converter keeps it in float32 by default, for a conversion to target."""
        if not self.applies(target):
            return {}
        ops = set(self.op_block_list)
        reason = f"kept in float32 by {self.title}'s {self.block_list_name} ({_shown_ops(self.op_block_list)})"
        found = {id(n): reason for n in graph.nodes if n.op_type in ops}
        if self.extra_blocked is not None:
            for key, why in self.extra_blocked(graph, target.name).items():
                found.setdefault(key, why)
        return found

    def clamp(self, target: Format) -> Clamp | None:
        return self.clamps.get(target.name) if self.applies(target) else None

    def reads_converted(self, initializer: bool, maker_blocked: bool, readers_blocked: Sequence[bool],
                        reader_blocked: bool) -> tuple[bool, bool]:
        """How one node reads a float32 constant the converter meets: (converted, clamped).

        converted: the node reads the copy in the target dtype (blocked readers through the Cast the converter puts
        before them); otherwise the numbers as stored, in float32. clamped: that copy went through the converter's
        clamp (where the clamp applies to how the constant is stored: Clamp.applies_to). initializer: an initializer
        (else a Constant node's tensor, whose node `maker_blocked` says whether the converter blocks: converted
        unless both it and the reader are blocked, where kept_constants holds);
        readers_blocked: for every node that reads it. Without a converter every constant is rounded as it is.
        """
        if self.plain:
            return True, False
        if self.initializers == "per-reader":  # modelopt: a copy per precision, the constants it casts included
            return not reader_blocked, not reader_blocked
        if not initializer:  # a tensor attribute: converted (clamped) with its node; else cast to the target after it
            return not (maker_blocked and reader_blocked and self.kept_constants), not maker_blocked
        converted = not any(readers_blocked) if self.initializers == "no-blocked-reader" else not all(readers_blocked)
        return converted, converted


_ML_OPS = {"ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
           "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
           "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier", "TreeEnsembleRegressor",
           "TreeEnsemble", "ZipMap"}


def _shown_ops(ops: tuple[str, ...]) -> str:
    """The list as a reason prints it: the ai.onnx ops by name, the ai.onnx.ml ones counted."""
    onnx_ops = [op for op in ops if op not in _ML_OPS]
    ml = len(ops) - len(onnx_ops)
    return ", ".join(onnx_ops) + (f" and {ml} ai.onnx.ml ops" if ml else "")


@dataclass
class KeepArgs:
    """What a keep-list snippet needs: the nodes and op types to keep, and how to load and save the model."""

    model: str  # the path as given
    dtype: str = "fp16"
    nodes: list[str] = field(default_factory=list)  # node names as the file spells them (unnamed: as named first)
    outputs: list[list[str]] = field(default_factory=list)  # per node, the tensors it makes (OpenVINO finds it so)
    op_types: list[str] = field(default_factory=list)  # op types kept whole (the user's --keep-fp32 op types)
    unnamed: bool = False  # some listed nodes have no name in the file: name them first
    duplicates: bool = False  # some graph has two nodes of one name (onnxruntime refuses it): rename repeats first
    large: bool = False  # over 2 GB with its external data: protobuf cannot hold it in one piece
    modules: list[str] = field(default_factory=list)  # PyTorch: module paths
    fx_nodes: list[str] = field(default_factory=list)  # PyTorch: torch.export (FX) node names
    keep_io: bool = False  # graph inputs and outputs stay float32 (keep_io_types=True): their range needs it
    out_path: str | None = None  # where the snippet saves (keep-list's own run: a scratch folder)
    # the model is the caller's onnx.ModelProto (precaudit.keep_list(proto)), not a file: the snippet takes it as
    # the variable `model`, and writes a file first only for a converter that reads one
    in_memory: bool = False

    @property
    def out(self) -> str:
        """Where the converted model goes: the model's file name with .fp16.onnx, in the folder the snippet runs in
        (never beside the input by default: that folder may be one the user cannot or should not write)."""
        if self.out_path is not None:
            return self.out_path
        name = self.name.replace("\\", "/").rsplit("/", 1)[-1]
        stem = name[:-5] if name.endswith(".onnx") else name
        return f"{stem}.{self.dtype}.onnx"

    @property
    def name(self) -> str:
        """The model's file name, for the names the snippet writes (an in-memory model has none of its own)."""
        return "model.onnx" if self.in_memory else self.model

    def output_line(self) -> str:
        """The snippet's first line: the variable every save in it writes to, for the user to set."""
        return f"OUTPUT_PATH = {self.out!r}  # where the converted model is written: set it to your own path"

    def load(self) -> str:
        if self.in_memory:
            return "# model: the onnx.ModelProto you passed to precaudit.keep_list()"
        if not self.large:
            return f"model = onnx.load({self.model!r})"
        inferred = self.out.replace(f".{self.dtype}.onnx", ".inferred.onnx")
        return (f"onnx.shape_inference.infer_shapes_path({self.model!r}, {inferred!r})  # works above 2 GB\n"
                f"model = onnx.load({inferred!r})  # with its external data")

    def naming(self) -> list[str]:
        """The loop that names unnamed nodes as precaudit names them (ir.generated_name) and renames a repeated name
        within a graph (ir.duplicate_renames), if the list needs it."""
        if not (self.unnamed or self.duplicates):
            return []
        return ["# name the nodes as precaudit does, so the lists can reach them: an unnamed node op type _ first",
                "# output, a name its graph already has (onnxruntime refuses two) name~1, name~2 ... past every name",
                "# the file gives a node",
                "def graphs(graph):",
                "    todo = [graph]",
                "    while todo:",
                "        g = todo.pop()",
                "        yield g",
                "        todo += [b for n in g.node for a in n.attribute for b in ([a.g] if a.HasField('g') else a.graphs)]",
                "taken = {n.name for g in graphs(model.graph) for n in g.node if n.name}",
                "for g in graphs(model.graph):",
                "    seen, repeats = set(), {}",
                "    for node in g.node:",
                "        if not node.name:",
                "            base = name = f\"{node.op_type}_{(list(node.output) or [''])[0]}\"",
                "            k = 0",
                "            while name in taken:",
                "                k += 1",
                "                name = f\"{base}~{k}\"",
                "            node.name = name",
                "        elif node.name in seen:",
                "            base, k = node.name, repeats.get(node.name, 0) + 1",
                "            while f\"{base}~{k}\" in taken:",
                "                k += 1",
                "            repeats[base] = k",
                "            node.name = f\"{base}~{k}\"",
                "        else:",
                "            seen.add(node.name)"]

    def save(self, path: str | None = None) -> str:
        """Python saving `model`: to path, or (None) to OUTPUT_PATH, the variable at the top of the snippet."""
        target = repr(path) if path is not None else "OUTPUT_PATH"
        if not self.large:
            return f"onnx.save(model, {target})"
        location = repr(path.rsplit('/', 1)[-1] + '.data') if path is not None else \
            "os.path.basename(OUTPUT_PATH) + '.data'"
        return f"onnx.save(model, {target}, save_as_external_data=True, location={location})"

    def named_copy(self) -> tuple[list[str], str]:
        """For a converter that reads the model from a path: Python writing a copy with every node named, and the
        copy's path; nothing (and the model's own path) when every listed node has its name."""
        if not (self.unnamed or self.duplicates or self.in_memory):
            return [], self.model
        copy = self.out.replace(f".{self.dtype}.onnx", ".named.onnx" if not self.in_memory else ".input.onnx")
        return ["# first, a copy with the nodes named as precaudit names them", "import onnx", self.load(),
                *self.naming(), self.save(copy), ""], copy


def py_list(items: list[str]) -> str:
    """A Python list literal, one string per item, the way repr quotes it (so any name pastes back exactly)."""
    return "[" + ", ".join(repr(i) for i in items) + "]"


PLAIN = Converter("plain", "no converter", ("fp16", "bf16", "fp8-e4m3", "fp8-e5m2"), "block list",
                  source="every float32 tensor runs in the target dtype; a widening Cast starts a float32 island")


