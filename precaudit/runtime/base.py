"""What a runtime model is: the facts it rests on (each cited or measured) and the kernels they decide.

A runtime model answers, for one runtime at one version, how each node of a graph really runs once the graph's
tensors are held in their stored dtypes: the format the kernel computes in, the format a fused normalization keeps
its statistics and its eps in, whether the runtime changes the target itself (a float32 graph that runs in float16),
and which intermediates it never rounds to the stored dtype. Anything it does not model runs as the graph says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..converters import Clamp
    from ..dtypes import Format
    from ..ir import Graph, Node, Value

__all__ = ["Fact", "Kernel", "Runtime", "version_key"]


def version_key(version: str) -> tuple[int, ...]:
    """'1.27' -> (1, 27); '2026.4' -> (2026, 4). ValueError for anything else."""
    parts = version.split(".")
    if not parts or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise ValueError(version)
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class Fact:
    """One thing a runtime does, where it was read or measured, and the versions it holds in."""

    key: str  # "skip-layer-norm-fp16-accumulator": stable, what findings and docs name
    says: str  # one sentence a finding can quote
    source: str  # the file, PR or issue it was read in; "measured: ..." for what the tests measure here
    since: str | None = None  # first version it holds in (None: every version modelled before `until`)
    until: str | None = None  # first version it no longer holds in

    def holds_in(self, version: str) -> bool:
        key = version_key(version)
        return (self.since is None or key >= version_key(self.since)) and \
            (self.until is None or key < version_key(self.until))

    @property
    def measured(self) -> bool:
        """Measured on this project's machines (the tests measure it again where the runtime installs)."""
        return "measured" in self.source

    @property
    def how(self) -> str:
        if self.source.startswith("measured"):
            return "measured"
        return "read and measured" if self.measured else "read"


@dataclass(frozen=True)
class Kernel:
    """How one node runs: None in a field means as the graph says.

    compute: the format the kernel computes in ("fp32": onnxruntime CPU's cast-wrapped float16 ops).
    statistics: a fused normalization's statistics: a format name, or "input" when its stash_type is ignored and
    they run in the dtype the input is held in. eps: "input" when the kernel holds eps in the input's dtype.
    """

    fact: Fact
    compute: str | None = None
    statistics: str | None = None
    eps: str | None = None
    # the kernel reads its constants in float32 whatever the graph stores them in (a runtime that converts the graph
    # itself and keeps what it marks in float32: OpenVINO's fp16 compression)
    keeps_constants: bool = False
    # the formats the kernel reads its float activations and its float constants (weights, a bias) in, rounded where
    # they are held wider (OpenVINO CPU reorders a FullyConnected's float32 inputs and weights to bfloat16)
    reads: str | None = None
    weights: str | None = None
    # the format the kernel writes its output in before the value is converted to the format it is held in
    # (OpenVINO CPU's bfloat16 FullyConnected writes bfloat16, then converts it to a float16 graph output)
    writes: str | None = None
    # a normalization that writes its normalized value in this format, then scales and shifts it in a kernel of its
    # own (OpenVINO CPU: MVN, then a Multiply and an Add)
    normalized: str | None = None

    @property
    def converts(self) -> bool:
        """It reads, writes or normalizes in formats of its own (reads, weights, writes, normalized)."""
        return any((self.reads, self.weights, self.writes, self.normalized))


class Runtime:
    """A runtime at one version. Subclasses (one module per runtime) override what their runtime decides."""

    name = ""  # as --runtime spells it
    title = ""  # "onnxruntime CPU execution provider"
    versions: tuple[str, ...] = ()  # the versions whose behaviour is modelled, oldest first
    facts: tuple[Fact, ...] = ()  # every fact the model rests on, for `precaudit runtimes` and the docs
    # which graphs it runs: "onnx" (an ONNX file), "torch" (a PyTorch module), or both
    runs: tuple[str, ...] = ("onnx",)

    def __init__(self, version: str, asked: str | None = None):
        self.version = version
        # what the user asked for when it is not a modelled version (the nearest modelled one is used)
        self.asked = asked

    @property
    def spelled(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def label(self) -> str:
        """How a finding's reason names it: 'onnxruntime CUDA 1.26'."""
        return f"{self.title} {self.version}"

    def holds(self, fact: Fact) -> bool:
        return fact.holds_in(self.version)

    def target(self, fmt: Format) -> tuple[Format, Fact | None]:
        """The format float32 tensors really run in, given --dtype fmt (QNN's HTP runs float32 graphs in float16)."""
        return fmt, None

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        """How node runs when its first float input is held in `held`; None: as the graph says."""
        return None

    def fuses_layer_norm(self, root: Node, graph: Graph) -> Kernel | None:
        """Whether the runtime's graph optimizer fuses a decomposed LayerNorm (mean, centre, square, mean, add eps,
        sqrt, divide) whose square root is `root` into one kernel, and how that kernel keeps its statistics."""
        return None

    def clamp(self, fmt: Format) -> Clamp | None:
        """What it does to a float32 constant it converts into fmt itself (coremltools bumps tiny ones), if anything."""
        return None

    def widened(self, value: Value, graph: Graph) -> Fact | None:
        """Whether a value the graph stores narrow is never rounded to it at this runtime (onnxruntime CPU keeps
        what passes between two of its cast-wrapped kernels in float32); None: it is rounded as stored."""
        return None

    def held_in(self, value: Value, stored: Format, graph: Graph) -> tuple[str, Fact] | None:
        """The format the runtime really holds a value in where it is not `stored` (the format the converted graph
        stores it in): float32 where widened() says so; a runtime that narrows what it holds too
        (OpenVINO CPU's bfloat16 between kernels) overrides this. None: held as stored."""
        if stored.name not in ("fp16", "bf16"):
            return None
        fact = self.widened(value, graph)
        return None if fact is None else ("fp32", fact)
