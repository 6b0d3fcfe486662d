"""Proof that a fixed model still computes what the original did: both run in float32 with onnxruntime on the same
inputs, each repair compared where it acts against the tolerance it promised, every graph output compared; and, with
--trace, both emulated in the target dtype side by side (the traced-mode emulator, as keep-list verifies with).

A model stored in float16 or bfloat16 is read as float32 for this (weights and constants widened exactly, Casts to
the narrow type made Casts to float32), so "float32" means the same thing for every model: the added Casts of a
norm-float32 repair are no-ops there, and any difference is the repair's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import numpy_helper

from ..deployment import Deployment
from ..errors import InputError
from ..frontends.onnx_data import tensor_loader, text
from ..ir import Graph
from .model import ELEM_OF
from .plan import EXACT, Repair

__all__ = ["Comparison", "Emulated", "OutputDiff", "compare", "emulated", "stored_narrow"]

_NARROW = (T.FLOAT16, T.BFLOAT16)


@dataclass
class OutputDiff:
    name: str
    max_abs: float  # largest |fixed - original| where both are finite
    relative: float  # that over the original's largest |value|
    nonfinite_before: int
    nonfinite_after: int
    elements: int


@dataclass
class Comparison:
    widened: bool  # the model is stored in a narrow type and was read as float32
    outputs: list[OutputDiff] = field(default_factory=list)

    @property
    def largest(self) -> OutputDiff | None:
        return max(self.outputs, key=lambda d: d.relative, default=None)


@dataclass
class Emulated:
    """One model's emulated run in the target dtype, against its own float32 reference."""

    finite: bool  # every output finite wherever the reference is
    nonfinite_fraction: float  # of the output elements, inf/NaN in the emulated run and not in the reference
    error: float  # largest output error relative to the output's largest |value| (inf when not finite)
    first_nonfinite: str | None = None  # the node the first inf/NaN that reaches an output starts at


def stored_narrow(model: onnx.ModelProto) -> bool:
    """Whether the model stores its floats in float16/bfloat16 (an input, or most float initializers)."""
    g = model.graph
    if any(i.type.tensor_type.elem_type in _NARROW for i in g.input):
        return True
    floats = [t.data_type for t in g.initializer if t.data_type in (*_NARROW, T.FLOAT)]
    return bool(floats) and sum(t in _NARROW for t in floats) * 2 > len(floats)


# ---- float32 runs ----------------------------------------------------------------------------------------------


def compare(original: onnx.ModelProto, original_path: str, fixed: onnx.ModelProto, fixed_path: str,
            graph: Graph, fixed_graph: Graph, batches: list[dict[str, np.ndarray]], repairs: list[Repair],
            hint: str = "") -> Comparison:
    """Run both models in float32 on every batch; fill each repair's difference, bound and verdict, and what it
    alone changes in the graph outputs (the gate). Both protos are the caller's to give away: they are changed in
    place (outputs added; widened when stored narrow). hint is added to an onnxruntime error (the dims guessed).

    Each repair is checked on its own: its new and changed nodes, and every node downstream of them, are copied
    into the original, where they read the original's values; so a repair downstream of another is judged by what
    it does, not by what the first one changed upstream, and its copies of the graph outputs are the outputs of
    the original with this repair alone. The graph outputs are also compared between the whole fixed model and the
    original.
    """
    widen = stored_narrow(original)
    outputs = [v.name for v in graph.outputs if v.name in {o.name for o in fixed_graph.outputs}]
    checked, copies = _isolated(original, fixed, repairs, set(outputs))
    wanted_orig = {*outputs, *(c for iso in copies.values() for c in iso.names())}
    wanted_fixed = {*outputs}
    for i, r in enumerate(repairs):
        c = r.check
        if c.kind != "none" and c.value:
            wanted_orig.add(c.value)
            if c.stat:
                wanted_orig.add(c.stat)
            if i not in copies or copies[i].value is None:
                wanted_fixed.add(c.value)
    types = {v.name: v.dtype for n in graph.nodes if not n.subgraph_path for v in n.outputs if v.name}
    types.update({v.name: v.dtype for n in fixed_graph.nodes if not n.subgraph_path for v in n.outputs if v.name})
    types.update({v.name: v.dtype for v in graph.outputs})
    iso: _Isolation | None
    for i, iso in copies.items():
        if iso.value is not None:
            # a copy of the compared value exists only for a check that names one (_isolated)
            types[iso.value] = types.get(cast(str, repairs[i].check.value))
        for out, copy in iso.outputs.items():
            types[copy] = types.get(out)
    inputs = {v.name for v in graph.inputs}
    feeds = [_feeds(f, widen) for f in batches]
    # one session at a time: onnxruntime holds the weights it reads, and two models' would be twice that
    run = _session(checked, original_path, types, inputs, wanted_orig, widen, hint)
    orig_runs = [{**ins, **run(ins)} for ins in feeds]
    del run, checked
    run = _session(fixed, fixed_path, types, inputs, wanted_fixed, widen, hint)
    fixed_runs = [{**ins, **run(ins)} for ins in feeds]
    del run
    result = Comparison(widen)
    for name in outputs:
        result.outputs.append(_output_diff(name, orig_runs, fixed_runs))
    for i, r in enumerate(repairs):
        iso = copies.get(i)
        if iso is not None and iso.value is not None:
            _evaluate(r, orig_runs, [{r.check.value: o.get(iso.value)} for o in orig_runs])
            if r.check.kind == "ratio" and r.difference is not None and r.difference > 0.01:
                r.notes.append(f"some rows change by {r.difference:.2g}: their variance is near the new eps; where "
                               "that matters keep this norm in float32 instead (precaudit keep-list)")
        else:
            _evaluate(r, orig_runs, fixed_runs)
            if r.within is not None:
                r.notes.append("checked in the whole fixed model (its nodes could not be copied into the original "
                               "alone): the difference includes what repairs before it changed")
        if iso is not None:
            diffs = [_output_diff(out, orig_runs, [{out: o[copy]} for o in orig_runs])
                     for out, copy in iso.outputs.items() if all(copy in o for o in orig_runs)]
            _gate_measure(r, diffs)
        else:  # not separable: what the whole fixed model changes is the most this repair can change
            r.output_whole = True
            _gate_measure(r, result.outputs)
    return result


def _gate_measure(repair: Repair, diffs: list[OutputDiff]) -> None:
    worst = max(diffs, key=lambda d: d.relative, default=None)
    repair.output_change = worst.relative if worst is not None else 0.0
    repair.output_name = worst.name if worst is not None and worst.relative > 0 else None
    repair.output_made_finite = sum(max(0, d.nonfinite_before - d.nonfinite_after) for d in diffs)
    repair.output_newly_bad = sum(max(0, d.nonfinite_after - d.nonfinite_before) for d in diffs)


_SUFFIX = "::precaudit_check"


@dataclass
class _Isolation:
    """One repair copied into the original: its compared value's copy, and each graph output's copy."""

    value: str | None
    outputs: dict[str, str]

    def names(self) -> list[str]:
        return [*([self.value] if self.value else []), *self.outputs.values()]


def _isolated(original: onnx.ModelProto, fixed: onnx.ModelProto, repairs: list[Repair],
              graph_outputs: set[str]) -> tuple[onnx.ModelProto, dict[int, _Isolation]]:
    """The original with, per repair, a copy of the fixed model's nodes from what the repair changed onward (top
    graph only), reading the original's values for everything else. Returns the model and, per repair index it
    could copy, the names of the copies of its compared value and of the graph outputs it reaches."""
    check = original  # the caller's own copy: changed in place
    g = check.graph
    known = {text(i.name) for i in g.input} | {text(i.name) for i in g.initializer} | {""}
    known |= {text(o) for n in g.node for o in n.output}
    fixed_inits = {text(t.name): t for t in fixed.graph.initializer}
    # a node another repair changed is copied as the original has it, and a node another repair added is left
    # out: each repair is judged by its own change (a mask fill every layer reads reaches the next layer's softmax
    # through that layer's raised eps)
    original_nodes = {text(n.name): n for n in g.node if n.name}
    copies: dict[int, _Isolation] = {}
    for i, r in enumerate(repairs):
        if not r.changed:
            continue
        region = _region(list(fixed.graph.node), repairs, i, original_nodes)
        tag = f"{_SUFFIX}{i}"
        made = {text(o) for n in region for o in n.output if o}
        renamed = _renamed_copies(region, tag, made, known, fixed_inits)
        if renamed is None:
            continue
        new_nodes, new_inits = renamed
        for name, new_name in new_inits.items():
            tensor = onnx.TensorProto()
            tensor.CopyFrom(fixed_inits[name])
            tensor.name = new_name
            g.initializer.append(tensor)
        g.node.extend(new_nodes)
        value = r.check.value if r.check.kind != "none" and r.check.value in made else None
        copies[i] = _Isolation(value + tag if value else None,
                               {out: out + tag for out in sorted(graph_outputs & made)})
    return check, copies


def _region(fixed_nodes: list[onnx.NodeProto], repairs: list[Repair], i: int,
            original_nodes: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes repair i's values reach, forward in graph order: the fixed model's, except those another repair
    changed (the original's) or added (left out)."""
    r = repairs[i]
    mine_nodes, mine_values = set(r.nodes), set(r.changed)
    others = {name for j, o in enumerate(repairs) if j != i for name in o.nodes} - mine_nodes
    other_values = {v for j, o in enumerate(repairs) if j != i for v in o.changed} - mine_values
    descend, region = set(mine_values), []
    for n in fixed_nodes:
        name = text(n.name)
        outs = [text(o) for o in n.output]
        reads = _reads(n)
        reads_mine = bool(reads & mine_values) or any(o in mine_values for o in outs)
        if name in others or (not reads_mine and reads & other_values):
            if name not in original_nodes:
                continue  # another repair's own node: not in this repair's model
            n = original_nodes[name]  # noqa: PLW2901 -- the original of a node this repair's model also has
        if reads & descend or any(text(o) in mine_values for o in n.output):
            descend.update(text(o) for o in n.output if o)
            region.append(n)
    return region


def _renamed_copies(region: list[onnx.NodeProto], tag: str, made: set[str], known: set[str],
                    fixed_inits: dict[str, onnx.TensorProto]
                    ) -> tuple[list[onnx.NodeProto], dict[str, str]] | None:
    """Copies of the region's nodes, every value they make and every fixed-model initializer they read renamed with
    tag; None when a copy would read a value neither graph has, or the region is empty or holds control flow."""
    new_nodes, new_inits = [], {}
    for source in region:
        node = onnx.NodeProto()
        node.CopyFrom(source)
        for j, raw in enumerate(node.input):
            x = text(raw)
            if x in made:
                node.input[j] = x + tag
            elif x not in known:
                if x not in fixed_inits:
                    return None
                new_inits[x] = x + tag
                node.input[j] = x + tag
        for j, o in enumerate(node.output):
            if o:
                node.output[j] = text(o) + tag
        node.name = text(node.name) + tag
        new_nodes.append(node)
    if not new_nodes or any(n.op_type in ("If", "Loop", "Scan") for n in new_nodes):
        return None
    return new_nodes, new_inits


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs and, for an If/Loop/Scan, every name its bodies read (an outer value a
    body reads is no input of the node, yet what the node computes depends on it)."""
    names = {text(x) for x in node.input}
    stack = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    stack += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    while stack:
        body = stack.pop()
        for inner in body.node:
            names.update(text(x) for x in inner.input)
            stack += [a.g for a in inner.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack += [g for a in inner.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    return names


def _feeds(feeds: dict[str, np.ndarray], widen: bool) -> dict[str, np.ndarray]:
    out = {}
    for name, array in feeds.items():
        a = np.asarray(array)
        if widen and (a.dtype.kind == "f" or a.dtype.name == "bfloat16") and a.dtype != np.float64:
            a = a.astype(np.float32)
        out[name] = a
    return out


def _session(model: onnx.ModelProto, path: str, types: dict[str, str | None], inputs: set[str], wanted: set[str],
             widen: bool, hint: str = ""):
    """A function feeds → {name: array} for the wanted values (graph outputs, values made by top-level nodes).
    The model (the caller's own copy) gains those outputs in place."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise InputError(path, "onnxruntime is not installed (pip install 'precaudit[trace]')") from None

    m = model
    folder = Path(path).resolve().parent
    if widen:
        _widen(m, path, folder)
    present = {text(o.name) for o in m.graph.output}
    made = {text(o) for n in m.graph.node for o in n.output}
    fetch = []
    for name in sorted(wanted):
        if name in inputs or (name not in made and name not in present):
            continue
        if name not in present:
            elem = ELEM_OF.get(types.get(name) or "", 0) or _elem_of_numpy(types.get(name))
            if not elem:
                continue  # a value of unknown type: that repair is reported, not compared
            if widen and elem in _NARROW:
                elem = T.FLOAT
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
        fetch.append(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # op by op, as written
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # its errors come back as exceptions, said in one line
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    try:
        session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise InputError(path, f"onnxruntime cannot run the model in float32 to compare it: {first}") from None
    del m
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            got = session.run(fetch, {k: v for k, v in feeds.items() if k in names})
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise InputError(path, f"onnxruntime cannot run the model in float32 to compare it: {first}{hint}") \
                from None
        return dict(zip(fetch, got))
    return run


def _elem_of_numpy(dtype: str | None) -> int:
    """The ONNX element type of a non-float IR dtype name (int64, bool, ...), or 0."""
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))) if dtype else 0
    except (TypeError, ValueError, KeyError):
        return 0


def _widen(model: onnx.ModelProto, path: str, folder: Path) -> None:
    """float16/bfloat16 → float32 everywhere: tensors (read through precaudit's checked loader when external),
    Cast targets, Constant values, value types; bodies included."""
    stack = [model.graph]
    while stack:
        gp = stack.pop()
        for i, init in enumerate(gp.initializer):
            if init.data_type in _NARROW:
                gp.initializer[i].CopyFrom(_widened(init, path, folder))
        for vi in [*gp.input, *gp.output, *gp.value_info]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in _NARROW:
                vi.type.tensor_type.elem_type = T.FLOAT
        for node in gp.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _NARROW:
                    attr.t.CopyFrom(_widened(attr.t, path, folder))
                elif attr.type == onnx.AttributeProto.INT and text(attr.name) in ("to", "dtype") and attr.i in _NARROW:
                    attr.i = T.FLOAT
                elif attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def _widened(tensor: onnx.TensorProto, path: str, folder: Path) -> onnx.TensorProto:
    data = tensor_loader(tensor, path, folder, f"tensor '{text(tensor.name)}'")()
    return numpy_helper.from_array(np.asarray(data).astype(np.float32), text(tensor.name))


def _evaluate(repair: Repair, orig_runs: list[dict], fixed_runs: list[dict]) -> None:
    c = repair.check
    if c.kind == "none" or c.value is None:
        return
    worst, bound, made_finite, newly_bad, clamped, compared = 0.0, EXACT, 0, 0, 0, False
    for o, f in zip(orig_runs, fixed_runs):
        a, b = o.get(c.value), f.get(c.value)
        if a is None or b is None or np.shape(a) != np.shape(b):
            continue
        a = np.asarray(a, np.float64)
        b = np.asarray(b, np.float64)
        finite_a, finite_b = np.isfinite(a), np.isfinite(b)
        made_finite += int(np.count_nonzero(~finite_a & finite_b))
        newly_bad += int(np.count_nonzero(finite_a & ~finite_b))
        mask = finite_a & finite_b
        if c.kind == "guard" and c.stat is not None and c.stat in o:
            try:
                # every guard check is made with its threshold (guards.py)
                ok = np.broadcast_to(np.asarray(o[c.stat], np.float64) >= cast(float, c.threshold), a.shape)
            except ValueError:
                ok = np.ones(a.shape, bool)
            clamped += int(np.count_nonzero(mask & ~ok))
            mask = mask & ok
        if c.kind == "ratio":
            stat = o.get(c.stat) if c.stat else None
            if c.stat and stat is None:
                continue
            with np.errstate(all="ignore"):
                s = None if stat is None else np.asarray(stat, np.float64)
                assert c.old is not None and c.new is not None  # a ratio check is made with both
                g_old, g_new = np.asarray(c.old(s), np.float64), np.asarray(c.new(s), np.float64)
                ok = np.isfinite(g_old) & np.isfinite(g_new) & (g_old > 0) & (g_new > 0)
                r = g_old[ok] / g_new[ok]
            if r.size:
                bound = max(bound, float(np.max(np.maximum(np.abs(r - 1), np.abs(1 / r - 1)))) + EXACT)
        if not mask.any():
            compared = True
            continue
        ref = a
        if c.offset is not None:
            try:
                ref = a - c.offset(a)
            except ValueError:
                ref = a
        scale = float(np.max(np.abs(ref[mask])))
        diff = float(np.max(np.abs(b[mask] - a[mask])))
        worst = max(worst, diff / scale if scale > 0 else diff)
        compared = True
    if not compared:
        return
    repair.difference, repair.bound = worst, bound
    repair.made_finite, repair.clamped = made_finite, clamped
    repair.within = worst <= bound * (1 + 1e-6) and newly_bad == 0


def _output_diff(name: str, orig_runs: list[dict], fixed_runs: list[dict]) -> OutputDiff:
    max_abs, top, bad_a, bad_b, elements = 0.0, 0.0, 0, 0, 0
    for o, f in zip(orig_runs, fixed_runs):
        a, b = np.asarray(o[name]), np.asarray(f[name])
        elements += a.size
        if a.dtype.kind != "f" or a.shape != b.shape:
            if not np.array_equal(a, b):
                max_abs = math.inf
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        finite_a, finite_b = np.isfinite(a), np.isfinite(b)
        bad_a += int(np.count_nonzero(~finite_a))
        bad_b += int(np.count_nonzero(~finite_b))
        mask = finite_a & finite_b
        if mask.any():
            max_abs = max(max_abs, float(np.max(np.abs(a[mask] - b[mask]))))
            top = max(top, float(np.max(np.abs(a[mask]))))
    return OutputDiff(name, max_abs, max_abs / top if top > 0 else max_abs, bad_a, bad_b, elements)


# ---- emulated runs ---------------------------------------------------------------------------------------------


def emulated(graph: Graph, deployment: Deployment, batches: list[dict[str, np.ndarray]],
             engine: str, timeout: float | None = None) -> Emulated:
    """The model run in the target dtype by the traced-mode emulator (what keep-list verifies with); timeout: the
    seconds it may take (--timeout)."""
    from ..trace import Emulator
    from ..trace.sites import first_nonfinite_site

    resolver = deployment.resolver(graph)
    emulator = Emulator(graph, resolver, engine=engine)
    emulator.limit_time(timeout)
    for i, feeds in enumerate(batches):
        emulator.run(feeds, final=i == len(batches) - 1)
    bad, total, error, finite = 0, 0, 0.0, True
    for value in graph.outputs:
        s = emulator.stats.get(id(value))
        if s is None:
            continue
        total += s.elements
        extra = max(0, s.nonfinite - s.ref_nonfinite)
        bad += extra
        if extra:
            finite = False
        error = max(error, s.rel_error if math.isfinite(s.rel_error) else math.inf)
    if not finite:
        error = math.inf
    origin = first_nonfinite_site(graph, resolver, emulator.stats, len(batches)) if not finite else []
    return Emulated(finite, bad / total if total else 0.0, error, origin[0].node.name if origin else None)
