"""Options a run passes down to the frontends and the traced mode, parsed once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TorchOptions", "TraceOptions", "TRACE_ENGINES"]

# auto: onnxruntime where it is installed and the node allows, numpy kernels elsewhere
TRACE_ENGINES = ("auto", "onnxruntime", "numpy")


@dataclass
class TorchOptions:
    """How to turn a PyTorch input into a graph: example inputs when the factory gives none, and trust."""

    input_shapes: list[tuple[int, ...]] = field(default_factory=list)  # one per forward() argument
    input_dtype: str = "fp32"
    trust_pickle: bool = False  # unpickling runs arbitrary code: only with the user's explicit word
    # run the float32 module under torch.autocast on this device ("cuda", "cpu"), --dtype its autocast dtype;
    # None: --dtype means model.to(dtype)
    autocast: str | None = None
    # False (--no-factories): import no model.py:factory, so no Python code from the models' side runs
    factories: bool = True


@dataclass
class TraceOptions:
    """Traced mode: run the model on inputs and emulate the target dtype op by op."""

    inputs: list[str] = field(default_factory=list)  # .npz files, one batch each (one array per graph input)
    samples: int = 1
    dims: dict[str, int] = field(default_factory=dict)  # values for symbolic dims (--dim batch=2)
    seed: int = 0
    engine: str = "auto"  # onnxruntime where it is installed (numpy kernels for what it cannot run), or numpy only
    progress: bool = False  # a progress bar on a terminal; never in CI or with machine-readable output
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # --range NAME=LO:HI of synthesized inputs
    # --timeout: seconds a model's traced run may take (a Loop with an absurd trip count would run for ever); None: no
    # limit. The run stops between nodes on numpy and inside a session on onnxruntime (RunOptions.terminate)
    timeout: float | None = 1800.0
