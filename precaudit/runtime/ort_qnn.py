"""onnxruntime's QNN execution provider on Qualcomm's HTP: float32 graphs run in float16.

Read in onnxruntime PRs #19863 (enable_htp_fp16_precision, 2024-03) and #22186 (its default set to true,
2024-09), onnxruntime-qnn PR #782 (docs, merged 2026-08-31: with QAIRT 2.35 and later the HTP computes float ops in
FP16 on SoCs with float support whatever the option says; it no longer changes the precision) and PR #603 (the option
is a no-op). Versions are QAIRT's. No HTP here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import FORMATS
from .base import Fact, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format

__all__ = ["OrtQnn"]

HTP_FP16 = Fact(
    "htp-float-is-fp16", "the HTP computes float32 ops in float16 (QAIRT 2.35 and later, whatever "
    "enable_htp_fp16_precision says): a float32 graph runs as float16", "onnxruntime-qnn PR #782 (docs) and #603; "
    "onnxruntime PR #22186")


class OrtQnn(Runtime):
    name = "ort-qnn"
    title = "onnxruntime QNN (HTP)"
    versions = ("2.35",)
    facts = (HTP_FP16,)

    def target(self, fmt: Format) -> tuple[Format, Fact | None]:
        if fmt.name in ("fp32", "fp64"):
            return FORMATS["fp16"], HTP_FP16
        return fmt, None
