"""The deployment target — the dtype a model is converted to, the converter that converts it, the nodes kept in
float32 and the runtime that runs it — and the one place that builds the resolver saying which dtype each node of a
graph computes in."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .converters import PLAIN, Converter, converter_named
from .dtypes import Format, format_named

if TYPE_CHECKING:
    from .analysis.compute_dtype import DtypeResolver
    from .ir import Graph, Node
    from .runtime import Fact, Runtime

__all__ = ["Deployment"]


@dataclass(frozen=True)
class Deployment:
    """Where a model is going: its target format, the fp16 converter modelled (PLAIN: every float32 tensor runs in
    the target), and the op types, node names and globs kept in float32 (--keep-fp32)."""

    fmt: Format
    converter: Converter = PLAIN
    keep_fp32: tuple[str, ...] = ()
    runtime: Runtime | None = None  # None: judged as the graph and the converter say (no --runtime)
    retarget: Fact | None = None  # why fmt is not the --dtype asked for: the runtime runs it in another format

    @classmethod
    def named(cls, dtype: str | Format, converter: str | Converter | None = None, keep_fp32: Sequence[str] = (),
              runtime: str | Runtime | None = None) -> Deployment:
        """From the names the settings hold; KeyError names the choices for an unknown dtype or converter, ValueError
        for an unknown runtime."""
        fmt = dtype if isinstance(dtype, Format) else format_named(dtype)
        retarget = None
        if isinstance(runtime, str):
            from .runtime import runtime_named

            runtime = runtime_named(runtime)
        if runtime is not None:
            fmt, retarget = runtime.target(fmt)
        return cls(fmt, converter_named(converter), tuple(keep_fp32), runtime, retarget)

    def resolver(self, graph: Graph, keep_nodes: Sequence[Node] = (), keep_io: bool = False) -> DtypeResolver:
        """The compute dtype of every node and value of graph when it runs at this target. keep_nodes: nodes a
        keep-list under test keeps in float32; keep_io: the converter keeps the graph's inputs and outputs float32."""
        from .analysis.compute_dtype import DtypeResolver

        return DtypeResolver(graph, self.fmt, list(self.keep_fp32), self.converter, keep_nodes=tuple(keep_nodes),
                             keep_io=keep_io, runtime=self.runtime, retarget=self.retarget)

    def check_runs(self, path: str) -> None:
        """One line for a model the runtime does not run: ONNX runtimes run ONNX files; coremltools, eager PyTorch
        and Inductor run PyTorch modules."""
        runtime = self.runtime
        if runtime is None:
            return
        kind = "onnx" if path.lower().endswith(".onnx") else "torch"
        if kind in runtime.runs:
            return
        from .errors import InputError

        if kind == "onnx":
            raise InputError(path, f"--runtime {runtime.name}: {runtime.title} runs PyTorch modules, not ONNX files: "
                                   "audit the model.py:factory itself")
        raise InputError(path, f"--runtime {runtime.name}: {runtime.title} runs ONNX files: audit the model's ONNX "
                               "export, or the module itself with --runtime torch-cuda, inductor or coreml")

    def as_written(self) -> Deployment:
        """A model a converter already wrote runs as it is stored (on the same runtime): no converter to model,
        nothing kept by name."""
        return dataclasses.replace(self, converter=PLAIN, keep_fp32=())

    def without_converter(self) -> Deployment:
        return dataclasses.replace(self, converter=PLAIN)

    def at(self, fmt: Format) -> Deployment:
        return dataclasses.replace(self, fmt=fmt)
