"""The pipeline, one way: load → IR → sites → findings, for each model the user names."""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .analysis.collect import collect_sites
from .analysis.compute_dtype import DtypeResolver
from .analysis.quantized import quantization
from .analysis.sites.base import Site
from .analysis.sites.weight import find_weight_sites
from .collector import collector_paused
from .deployment import Deployment
from .errors import InputError
from .finding import Finding, measured_on
from .frontends.onnx import load_onnx
from .ir import Graph
from .options import TorchOptions, TraceOptions
from .result import AuditResult
from .rules.engine import Match, apply_rules, match_rules
from .rules.loader import Rule
from .suppress import drop_suppressed

if TYPE_CHECKING:
    from .trace import TraceRun

__all__ = ["AuditResult", "audit_models", "load_graph", "static_matches"]


def load_graph(path: str, torch_options: TorchOptions | None = None, target: str = "fp16",
               dims: dict[str, int] | None = None, strict_dims: bool = True) -> Graph:
    """Pick the frontend by what the user named: an .onnx file, or a PyTorch model (imported lazily). dims: the
    sizes the user gave symbolic dims (--dim), each checked to name one where strict_dims (dims.size_dims)."""
    from .dims import size_dims

    return size_dims(_load(path, torch_options, target), dims, strict_dims)


def _load(path: str, torch_options: TorchOptions | None, target: str) -> Graph:
    if path.lower().endswith(".onnx"):
        return load_onnx(path)
    from .frontends.torch_input import is_torch_input, load_torch

    if is_torch_input(path):
        return load_torch(path, torch_options or TorchOptions(), target)
    raise InputError(path, "unsupported model type: precaudit reads .onnx files and PyTorch models "
                           "(model.py:factory, package.module:factory, .pt2, TorchScript .pt)")


def static_matches(graph: Graph, resolver: DtypeResolver, rules: list[Rule], path: str, weights: bool = False,
                   keep: Callable[[list[Finding]], list[Finding]] | None = None) -> list[Match]:
    """The static pass over one graph, as every command runs it: sites (every weight when asked, else the fused
    normalizations' per-channel parameters), the rules, then the inline suppressions and, where given, the
    configured ignores (keep). Each finding with its rule and site."""
    patterns = {rule.id: rule.pattern for rule in rules if rule.pattern is not None}
    sites = collect_sites(graph, resolver, patterns) + find_weight_sites(graph, resolver, norm_params_only=not weights)
    matches = match_rules(rules, sites, path)
    counted = drop_suppressed([m.finding for m in matches])
    if keep is not None:
        counted = keep(counted)
    kept = {id(f) for f in counted}
    return [m for m in matches if id(m.finding) in kept]


def _traced(path: str, graph: Graph, resolver: DtypeResolver, trace: TraceOptions,
            torch_options: TorchOptions | None, deployment: Deployment) -> tuple[list[Site], TraceRun]:
    """Traced sites; a PyTorch model is run from its ONNX export, since the emulator runs ONNX ops (no ONNX
    converter converts it: the module itself is converted, model.to(dtype))."""
    from .trace import traced_sites  # numpy emulation loads only in traced mode

    if path.lower().endswith(".onnx"):
        return traced_sites(graph, resolver, trace)
    from .frontends.torch_input import load_torch_for_trace

    exported = load_torch_for_trace(path, torch_options or TorchOptions(), deployment.fmt.name)
    return traced_sites(exported, deployment.without_converter().resolver(exported), trace)


def audit_models(paths: list[str], deployment: Deployment, rules: list[Rule],
                 torch_options: TorchOptions | None = None, trace: TraceOptions | None = None,
                 check_weights: bool = False, dtype_maps: bool = False,
                 dims: dict[str, int] | None = None, debug: bool = False, strict_dims: bool = True) -> AuditResult:
    """Audit each model; a model that fails to load is recorded as an error and the rest go on.

    Weights are read only where the run reads them anyway (--trace) or the user asked (--check-weights); the
    fused normalizations' parameters (per-channel vectors of at most MAX_CHANNELS values) always.
    dtype_maps keeps each node's compute dtype and its reason (the HTML report's dtype map). deployment: the
    target dtype, the fp16 converter modelled (its default block list, constant clamp and Cast handling) and the
    nodes kept in float32.
    dims sizes symbolic dims for the static pass too (--dim: a Range up to the sequence length is then bounded);
    strict_dims (one model in the run) refuses a name that is none of its dims, else each model takes its own.
    An unexpected failure in one model (a bug, a MemoryError, a PyTorch factory's exit()) is that model's error
    entry, and the others are audited and reported; debug prints its traceback.
    """
    result = AuditResult()
    weight_rules = any(kind in rule.sites for rule in rules for kind in ("weight", "block_weight"))
    for index, path in enumerate(paths):
        if index:
            # The last model's graph is tens of thousands of objects in reference cycles (a value and the node
            # that makes it), which the paused collector left alone: freed now, each model costs one model's
            # memory, not the sum of all before it.
            graph = resolver = sites = None
            gc.collect()
        try:
            deployment.check_runs(path)
            # paused only where precaudit's own code runs: a PyTorch model's capture keeps the collector
            with collector_paused(path.lower().endswith(".onnx")):
                graph = load_graph(path, torch_options, deployment.fmt.name, dims, strict_dims)
            with collector_paused():
                resolver = deployment.resolver(graph)
                if dtype_maps:
                    from .report.dtype_map import node_dtypes
                    result.dtype_maps[path] = node_dtypes(graph, resolver)
                patterns = {rule.id: rule.pattern for rule in rules if rule.pattern is not None}
                sites = collect_sites(graph, resolver, patterns)
                quantized = quantization(graph)
                if quantized is not None:
                    result.quantized[path] = quantized
            traced: list[Site] = []
            if trace is not None:
                # several models: each runs with the --dim sizes of the dims it has (its static pass took the same)
                mine = trace if strict_dims or not path.lower().endswith(".onnx") else \
                    dataclasses.replace(trace, dims={k: v for k, v in trace.dims.items() if k in graph.dim_sizes})
                traced, result.traces[path] = _traced(path, graph, resolver, mine, torch_options, deployment)
            # every weight where the run reads them anyway or the user asked; else the norms' per-channel parameters
            weights = find_weight_sites(graph, resolver, norm_params_only=trace is None and not check_weights) \
                if weight_rules else []
            with collector_paused():
                findings = apply_rules(rules, sites, path)
                # a traced number holds for the inputs it was measured on, and says which
                source = result.traces[path].source if traced else None
                measured = [measured_on(f, source) for f in apply_rules(rules, traced, path)]
                findings += measured + apply_rules(rules, weights, path)
                result.findings.extend(drop_suppressed(findings))
        except InputError as exc:
            result.errors.append(exc)
            continue
        except OSError as exc:  # a file the model names (its external data) that the system refuses to open
            result.errors.append(InputError(path, f"{exc.strerror or type(exc).__name__}"
                                                  f"{': ' + os.fsdecode(exc.filename)[:200] if exc.filename else ''}"))
            continue
        except (Exception, SystemExit) as exc:  # not KeyboardInterrupt: the user stops the whole run
            if debug:
                import traceback

                traceback.print_exc()
            result.errors.append(_internal_error(path, exc))
            continue
        result.models.append(path)
    return result


def _internal_error(path: str, exc: BaseException) -> InputError:
    """One line for a failure precaudit did not expect, on the model it happened in."""
    # InputError escapes what it prints (the message may quote a model's names)
    what = f"something called exit({exc.code!r})" if isinstance(exc, SystemExit) else \
        f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return InputError(path, f"internal error auditing this model: {what} (rerun with --debug for a traceback; the "
                            "other models were audited)")
