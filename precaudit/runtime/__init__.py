"""The runtimes precaudit models (--runtime NAME[@VERSION]): what each really computes in, one module per runtime,
each citing the code it follows or saying what was measured here (base.py says what a model answers)."""

from __future__ import annotations

from .base import Fact, Kernel, Runtime, version_key

__all__ = ["RUNTIME_NAMES", "Fact", "Kernel", "Runtime", "runtime_classes", "runtime_named"]

# as --runtime spells them, in the order the docs and the deployment matrix list them
RUNTIME_NAMES = ("ort-cpu", "ort-cuda", "ort-webgpu", "ort-dml", "ort-qnn", "tensorrt", "openvino-cpu",
                 "openvino-gpu", "coreml", "torch-cuda", "inductor")


def runtime_classes() -> dict[str, type[Runtime]]:
    """name -> the runtime's class; the modules load when a runtime is asked for."""
    from .coreml import CoreMl
    from .inductor import Inductor
    from .openvino_cpu import OpenVinoCpu
    from .openvino_gpu import OpenVinoGpu
    from .ort_cpu import OrtCpu
    from .ort_cuda import OrtCuda
    from .ort_dml import OrtDml
    from .ort_qnn import OrtQnn
    from .ort_webgpu import OrtWebGpu
    from .tensorrt import TensorRT
    from .torch_cuda import TorchCuda

    classes = (OrtCpu, OrtCuda, OrtWebGpu, OrtDml, OrtQnn, TensorRT, OpenVinoCpu, OpenVinoGpu, CoreMl, TorchCuda,
               Inductor)
    return {c.name: c for c in classes}


def runtime_named(spec: str) -> Runtime:
    """'ort-cuda@1.26' or 'ort-cuda' (its newest modelled version). A version between or beyond the modelled ones is
    judged as the newest modelled one not after it (or the oldest), and Runtime.asked keeps what was asked.
    ValueError says what is wrong: an unknown name (listing the known ones) or a version that is no version."""
    name, _, version = spec.partition("@")
    cls = runtime_classes().get(name)
    if cls is None:
        raise ValueError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIME_NAMES)} (precaudit runtimes "
                         "lists what each models)")
    if not version:
        return cls(cls.versions[-1])
    try:
        asked = version_key(version)
    except ValueError:
        raise ValueError(f"{spec!r}: the version must be numbers with dots (modelled: "
                         f"{', '.join(cls.versions)})") from None
    if version in cls.versions:
        return cls(version)
    earlier = [v for v in cls.versions if version_key(v) <= asked]
    return cls(earlier[-1] if earlier else cls.versions[0], asked=version)
