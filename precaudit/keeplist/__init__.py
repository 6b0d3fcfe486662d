"""`precaudit keep-list`: the nodes to keep in float32 for a converter, from the findings and, with --trace,
verified by emulation.

Static: every error or warning finding names a node; its entry is that node's whole norm chain (from the
statistic's input to the division), or the node. A second audit with the list kept says which findings a
float32 node fixes at all (an eps outside the sqrt, a Log of a Softmax are wrong in every dtype): the others are
reported, not listed. Traced: `verify.verify` emulates the model with the list, adds what the trouble comes from
until the outputs are finite and within the tolerance, then drops what is not needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..analysis.compute_dtype import DtypeResolver
from ..audit_models import static_matches
from ..converters import PLAIN, Converter, converter_named
from ..deployment import Deployment
from ..dtypes import FORMATS, Format
from ..errors import InputError
from ..finding import Finding
from ..ir import Graph, Node
from ..options import check_choice
from ..rules.engine import Match
from ..rules.loader import Rule
from .chains import NormChains, with_constant_nodes
from .verify import Verification, verify

if TYPE_CHECKING:
    from ..context import Audit
    from ..runtime import Fact, Runtime
    from ..trace.inputs import InputSource
    from .snippet_run import SnippetCheck

__all__ = ["FOR_TARGETS", "POLICIES", "Entry", "KeepList", "Policy", "build_keep_list", "static_findings"]

# What --for accepts: the ONNX converters (each with its converter model), OpenVINO (its own fp16 compression, which a
# snippet marks the nodes for), the PyTorch ways to keep modules, ModelOpt's quantization config for the
# block-scaled formats (--dtype mxfp8|mxfp4|nvfp4: the nodes kept unquantized), and the runtimes that decide what a
# node computes in themselves (runtime_targets.py: judged at that runtime, in what it honours).
FOR_TARGETS = ("onnxconverter-common", "onnxruntime", "olive", "modelopt", "openvino", "pytorch", "torch-tensorrt",
               "modelopt-quant", "tensorrt", "coreml", "qnn", "dml", "webgpu")
_PYTORCH_TARGETS = ("pytorch", "torch-tensorrt", "coreml")
QUANT_TARGET = "modelopt-quant"
_ONNX_TARGETS = tuple(t for t in FOR_TARGETS if t not in (*_PYTORCH_TARGETS, QUANT_TARGET))
_TWO_GB = 2 ** 31 - 1  # protobuf's limit on one serialized message


@dataclass
class Entry:
    """A group of nodes kept for one reason: the findings at a norm chain, or what a traced run showed."""

    source: str  # "static" or "traced"
    reasons: list[str]
    nodes: list[Node]
    dropped: bool = False  # traced: the list verified without it
    findings: list[Finding] = field(default_factory=list)  # static: the findings behind it
    keep_io: bool = False  # traced: the entry also keeps the graph inputs float32 (keep_io_types=True)
    sites: list[Node] = field(default_factory=list)  # static: the node each finding is at, by identity


POLICIES = ("minimal", "safe")


@dataclass
class Policy:
    """Which of the two traced lists the snippet applies: minimal (the smallest list that verifies on the inputs)
    or safe (every static finding's nodes, and what the run added); why; what the other list would change."""

    applied: str
    why: str
    adds: list[Node] = field(default_factory=list)  # nodes the other list keeps and this one does not
    drops: list[Node] = field(default_factory=list)  # nodes this list keeps and the other does not
    reasons: list[str] = field(default_factory=list)  # why the other list keeps what it adds (static findings)

    @property
    def other(self) -> str:
        return "safe" if self.applied == "minimal" else "minimal"


@dataclass
class KeepList:
    """What `precaudit keep-list` (and precaudit.keep_list()) found: the nodes to keep in float32 for a converter,
    checked as far as it could be; code() is the snippet, exit_code what the command line exits with."""

    model: str
    graph: Graph
    target: Format
    target_for: str
    converter: Converter
    keep_fp32: list[str]  # the user's own block list (op types, names, globs)
    entries: list[Entry] = field(default_factory=list)
    not_fixed: list[Finding] = field(default_factory=list)  # findings that no float32 node fixes
    verification: Verification | None = None
    tolerance: float | None = None
    inputs: str = ""  # what the verification ran on
    source: InputSource | None = None
    batches: list = field(default_factory=list, repr=False)  # the verification's inputs, for the snippet's run
    snippet_check: SnippetCheck | None = None  # the printed snippet, run with the real converter
    runtime: Runtime | None = None  # the runtime the list is judged at (--runtime, or the one --for names)
    retarget: Fact | None = None  # why target is not the --dtype asked for (the runtime's own format)
    alternative: str = ""  # why the list printed is not the first one found (a converter that cannot keep it)
    policy: Policy | None = None  # traced: which list is printed (--policy), and what the other would change

    # how reports name the model when it is no file of the user's (precaudit.keep_list(proto) writes a scratch
    # file); in_memory: the snippet then takes the caller's ModelProto as `model` instead of loading a path
    shown: str | None = None
    in_memory: bool = False
    @property
    def deployment(self) -> Deployment:
        """The target, the converter verified with and the user's own block list, as one value."""
        return Deployment(self.target, self.converter, tuple(self.keep_fp32), self.runtime, self.retarget)

    @property
    def verified(self) -> bool:
        """Emulated within the tolerance, and the snippet's real model too where it ran; no error finding left."""
        if self.verification is None or self.verification.final is None:
            return False
        check = self.snippet_check
        if self.alternative:  # the list changed after the emulation: the real converter's run is the measure
            return check is not None and check.ran and check.error is not None and check.within(self.tolerance or 0.0)
        if not self.verification.final.ok(self.tolerance or 0.0):
            return False
        return check is None or not check.ran or check.within(self.tolerance or 0.0)

    @property
    def exit_code(self) -> int:
        """0 checked (the snippet ran and, traced, verified on the user's inputs); 1 not verified, or the snippet
        fails; 3 verified on synthesized inputs only, or the snippet (or the model it writes) could not be run
        here."""
        check = self.snippet_check
        if check is not None and check.ran and not check.ok:
            return 1
        if self.alternative and not self.verified:  # the list printed leaves out what a finding needs kept
            return 1
        if self.verification is not None:
            if not self.verified:
                return 1
            if self.source is None or self.source.synthesized:
                return 3
        if check is None or not check.ran or check.unverified:
            return 3
        return 0

    def reason(self) -> str | None:
        """Why the exit code is 1, in one line (for stderr); None otherwise."""
        if self.exit_code != 1:
            return None
        check = self.snippet_check
        if check is not None and check.ran and not check.ok:
            why = check.problem or (f"the converted model still has {check.errors[0]}" if check.errors else
                                    "the converted model's outputs are inf/NaN where float32's are not")
            return f"NOT verified: {why}"
        if self.alternative:
            return f"NOT verified: {self.alternative}"
        final = self.verification.final if self.verification is not None else None
        if self.verification is not None and self.verification.stopped:
            return f"NOT verified: {self.verification.stopped}"
        if final is not None and not final.finite:
            return "NOT verified: an emulated output is inf/NaN with the list kept"
        if final is not None:
            return f"NOT verified: emulated output error {final.error:.3g}, beyond --tolerance {self.tolerance:g}"
        return "NOT verified: the converted model's output error is beyond --tolerance"

    @property
    def nodes(self) -> list[Node]:
        """Every kept node, in graph order."""
        ids = {id(n) for e in self.entries if not e.dropped for n in e.nodes}
        return [n for n in self.graph.nodes if id(n) in ids]

    def __repr__(self) -> str:  # (the dataclass's would print the whole graph)
        from ..escape import printable

        state = "static" if self.verification is None else "verified" if self.verified else "NOT verified"
        return (f"<precaudit.KeepList {printable(self.shown or self.model)[:80]} --for {self.target_for}: "
                f"{len(self.nodes)} nodes kept, {state}, exit code {self.exit_code}>")

    def to_text(self) -> str:
        from .render import render_text
        return render_text(self)

    def to_json(self) -> str:
        from .render import render_json
        return render_json(self)

    def code(self) -> str | None:
        """The converter's snippet, ready to paste (None where the model it writes does not load)."""
        import json
        return json.loads(self.to_json())["snippet"]

    @property
    def keep_io(self) -> bool:
        """The converter must keep the graph inputs and outputs float32 (keep_io_types=True)."""
        return any(e.keep_io and not e.dropped for e in self.entries)

    @property
    def pytorch(self) -> bool:
        """The snippet is the user's PyTorch code to paste, run here only for coreml (coreml_snippet.py)."""
        return self.target_for in _PYTORCH_TARGETS

    def op_type_counts(self) -> dict[str, int]:
        """Per op type of a kept node, how many nodes of the graph blocking that whole op type keeps."""
        types = {n.op_type for n in self.nodes}
        counts: dict[str, int] = {}
        for node in self.graph.nodes:
            if node.op_type in types:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    @property
    def large(self) -> bool:
        """Over 2 GB with its weights: the converters must take it by path or with external data."""
        seen, total = set(), 0
        for node in self.graph.nodes:
            for v in node.inputs:
                if v is not None and v.is_const and v.producer is None and id(v) not in seen:
                    seen.add(id(v))
                    fmt = FORMATS.get(v.dtype or "")
                    total += (v.const_size or 0) * (fmt.itemsize if fmt is not None else 4)
        return total > _TWO_GB


def converter_for(target_for: str) -> Converter:
    """The converter model a --for target is verified with (PyTorch targets: model.to(dtype), no converter)."""
    check_choice(target_for, FOR_TARGETS, "--for")
    if target_for == "openvino":  # no --converter: OpenVINO converts the model itself, as it reads it
        from ..converters.openvino import CONVERTER

        return CONVERTER
    from .runtime_targets import RUNTIME_OF  # a runtime's target: its converter is decided once the model is read

    if target_for in (*_PYTORCH_TARGETS, QUANT_TARGET, *RUNTIME_OF):
        return PLAIN
    return converter_named(target_for)


def build_keep_list(audit: Audit, path: str, target_for: str, tolerance: float = 1e-2, max_runs: int = 30,
                    progress: Callable[[str], None] | None = None, policy: str | None = None) -> KeepList:
    """The keep-list of one model: static from its findings, verified by emulation when the audit is traced.
    policy: minimal or safe, the traced list printed (None: minimal on the user's inputs, safe on synthesized
    ones)."""
    from ..audit_models import load_graph
    from ..frontends.torch_input import is_torch_input
    from .runtime_targets import converter_after_load, deployment_for

    converter = converter_for(target_for)
    deployment = deployment_for(audit.deployment, target_for)
    target, trace, torch_options = deployment.fmt, audit.trace, audit.torch
    keep_fp32, rules = list(deployment.keep_fp32), audit.rules
    torch_model = not path.lower().endswith(".onnx") and is_torch_input(path)
    _check_quant_target(target_for, target)
    if torch_model != (target_for in _PYTORCH_TARGETS) and target_for != QUANT_TARGET:
        kind = "a PyTorch model" if torch_model else "an ONNX model"
        choices = _PYTORCH_TARGETS if torch_model else _ONNX_TARGETS
        raise InputError(path, f"--for {target_for} does not apply to {kind}; choose {' or '.join(choices)}")
    deployment.check_runs(path)
    if torch_model and trace is not None:
        # the emulator runs ONNX: a PyTorch model is verified on its export, whose nodes carry the module paths
        from ..frontends.torch_input import load_torch_for_trace
        graph = load_torch_for_trace(path, torch_options, target.name)
    else:
        graph = load_graph(path, torch_options, target.name, audit.dims)
    keep = audit.ignored
    converter = converter_after_load(target_for, graph, target, converter)
    result = KeepList(path, graph, target, target_for, converter, list(keep_fp32), runtime=deployment.runtime,
                      retarget=deployment.retarget)
    resolver = result.deployment.resolver(graph)
    chains = NormChains(graph, resolver)
    weights = trace is not None
    matches = [m for m in static_matches(graph, resolver, rules, path, weights, keep)
               if m.finding.severity in ("error", "warning")]
    result.entries = _static_entries(matches, chains, converter)
    _drop_unfixable(result, rules, weights, keep)
    if trace is not None:
        from ..trace.inputs import input_batches
        batches, result.source = input_batches(graph, trace)
        result.batches = batches
        result.inputs = result.source.describe()
        result.policy = _policy(policy, result.source.synthesized)

        def verified(start: list[Node]) -> Verification:
            return verify(graph, result.deployment, start, chains, batches, trace.engine, tolerance, max_runs,
                          progress, trace.timeout)

        static_entries = result.entries
        static = [n for e in static_entries for n in e.nodes]
        check = verified(static if result.policy.applied == "safe" else [])
        if result.policy.applied == "minimal":
            result.entries = []
        result.entries += [Entry("traced", [a.reason], a.nodes, a.dropped, keep_io=a.keep_io) for a in check.added]
        result.verification, result.tolerance = check, tolerance
        _compare_policies(result, static_entries, verified)
    elif policy is not None:
        raise InputError(None, f"--policy {policy}: the two lists differ by what a traced run measures; add --trace")
    return result


def _check_quant_target(target_for: str, target: Format) -> None:
    """A block-scaled --dtype keeps nodes out of the quantized set (ModelOpt's quantization config); the converters
    keep nodes in float32 when a model is converted to fp16 or bf16."""
    if target_for == QUANT_TARGET and not target.blocked:
        raise InputError(None, f"--for {QUANT_TARGET} lists the nodes to leave out of a block-scaled format: use it "
                               "with --dtype mxfp8, mxfp4 or nvfp4")
    if target.blocked and target_for != QUANT_TARGET:
        raise InputError(None, f"--dtype {target.name} quantizes what MatMul, Gemm and Conv read, which no converter "
                               f"undoes: --for {QUANT_TARGET} lists the nodes to leave unquantized")


def _policy(policy: str | None, synthesized: bool) -> Policy:
    """The list printed. By default minimal on the user's own inputs: what they measure is the need, and the
    static list's extra nodes (norm rules these inputs never trigger) cost speed for nothing measured; safe on
    synthesized inputs, which measure no real data: every static finding keeps its nodes."""
    if policy is not None:
        return Policy(check_choice(policy, POLICIES, "--policy"), "chosen with --policy")
    if synthesized:
        return Policy("safe", "the default on synthesized inputs, which measure nothing of your data: every static "
                              "finding keeps its nodes")
    return Policy("minimal", "the default with --trace on your inputs: the smallest list that verifies on them")


def _compare_policies(result: KeepList, static_entries: list[Entry], verified: Callable) -> None:
    """What the other policy's list would add and drop. Against a minimal list, the safe one adds the static
    entries' nodes it does not hold (no second run: safe starts from them and keeps them all). Against a safe list,
    the minimal one is a second verification, from nothing."""
    assert result.policy is not None  # set by build_keep_list before
    mine = {id(n) for n in result.nodes}
    if result.policy.applied == "minimal":
        static = {id(n) for e in static_entries for n in e.nodes}
        result.policy.adds = [n for n in result.graph.nodes if id(n) in static and id(n) not in mine]
        result.policy.reasons = [r for e in static_entries if any(id(n) not in mine for n in e.nodes)
                                 for r in e.reasons]
        return
    minimal = verified([])
    other = {id(n) for a in minimal.added if not a.dropped for n in a.nodes}
    result.policy.adds = [n for n in result.graph.nodes if id(n) in other and id(n) not in mine]
    result.policy.drops = [n for n in result.graph.nodes if id(n) in mine and id(n) not in other]


def static_findings(graph: Graph, resolver: DtypeResolver, rules: list[Rule], path: str,
                    weights: bool, keep: Callable[[list[Finding]], list[Finding]] | None = None) -> list[Finding]:
    """The audit's findings with this resolver (weights read only when asked: --trace reads them anyway), less
    the inline suppressions and the configured ignores: the pass `precaudit check` runs."""
    return [m.finding for m in static_matches(graph, resolver, rules, path, weights, keep)]


def _static_entries(matches: list[Match], chains: NormChains, converter: Converter) -> list[Entry]:
    """One entry per chain (or node) that findings point at, with every finding there as a reason, and the Constant
    nodes they read where the converter needs those blocked too. The node is the site's own, by identity: two nodes
    of one name are two entries."""
    entries: dict[int, Entry] = {}
    for m in matches:
        node, finding = m.site.node, m.finding
        nodes = chains.of(node) or list(m.site.span) or [node]
        entry = entries.setdefault(id(nodes[0]), Entry("static", [], with_constant_nodes(nodes, converter)))
        entry.findings.append(finding)
        entry.sites.append(node)
        entry.reasons.append(f"{finding.rule_id} {finding.rule_name} at '{finding.node_name}'")
    return list(entries.values())


def _drop_unfixable(result: KeepList, rules: list[Rule], weights: bool, keep) -> None:
    """Audit again with the list kept: a finding still there is no float32 node's to fix; an entry whose findings
    all stay is no entry."""
    kept = [n for e in result.entries for n in e.nodes]
    resolver = result.deployment.resolver(result.graph, keep_nodes=kept)
    stay = {(m.finding.rule_id, id(m.site.node)) for m in
            static_matches(result.graph, resolver, rules, result.model, weights, keep)}
    entries = []
    for entry in result.entries:
        fixed = [(f, r) for f, r, n in zip(entry.findings, entry.reasons, entry.sites)
                 if (f.rule_id, id(n)) not in stay]
        result.not_fixed += [f for f, n in zip(entry.findings, entry.sites) if (f.rule_id, id(n)) in stay]
        if fixed:
            entry.findings, entry.reasons = [f for f, _ in fixed], [r for _, r in fixed]
            entries.append(entry)
    result.entries = entries
