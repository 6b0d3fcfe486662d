"""The facts many kinds of site carry, computed one way: the compute dtype's, and an eps's."""

from __future__ import annotations

import math
from typing import Any

from ...dtypes import classify, round_to_format
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..constants import ScalarConst

__all__ = ["dtype_facts", "eps_facts"]


def dtype_facts(dtype: ComputeDtype, resolver: DtypeResolver) -> dict[str, Any]:
    """The dtype a site computes in, why, and the numbers of its format; the target the user asked for."""
    runtime = resolver.runtime
    return {"compute_dtype": dtype.fmt.long_name, "compute_reason": dtype.reason,
            "target_dtype": resolver.target.long_name, "target_ulp_at_1": resolver.target.ulp_at_1,
            # the runtime modelled and, where it decided this dtype, the fact and where it was read or measured
            "runtime": runtime.spelled if runtime is not None else None,
            "compute_fact": dtype.fact.key if dtype.fact is not None else None,
            "compute_source": dtype.fact.source if dtype.fact is not None else None,
            **dtype.fmt.numbers()}


def eps_facts(eps: float | ScalarConst | None, dtype: ComputeDtype) -> dict[str, Any]:
    """The eps as written, as a --converter leaves a constant one (clamped), and as rounded into its dtype."""
    value = eps.value if isinstance(eps, ScalarConst) else eps
    # the format the eps reaches the kernel in: the one it is stored in where that is narrower (a float16 file on a
    # runtime that computes in float32), else the compute dtype; eps_floor its smallest normal number
    held = dtype.stored if dtype.stored is not None and isinstance(eps, ScalarConst) else dtype.fmt
    facts: dict[str, Any] = {"has_eps": value is not None, "eps": value, "eps_converted": None, "eps_rounded": None,
                             "eps_class": None, "eps_dtype": held.long_name, "eps_floor": held.smallest_normal}
    if value is not None:
        if isinstance(eps, ScalarConst):  # an attribute eps is never converted
            converted = dtype.constant(value, eps.source)
            if converted != value:
                assert dtype.clamp is not None  # only a converter's clamp changes a constant
                facts["eps_converted"] = converted
                facts["eps_source"] = f"{eps.source}; {dtype.clamp.words}: {value:.3g} → {converted:.3g}"
                value = converted
            if dtype.stored is not None:  # kept in a narrower format than the kernel computes in
                stored = round_to_format(value, dtype.stored)
                if stored != value:
                    facts["eps_source"] = (f"{facts.get('eps_source') or eps.source}; stored as "
                                           f"{dtype.stored.long_name}: {stored:.5g}")
                    value = stored
        facts["eps_rounded"] = round_to_format(value, dtype.fmt)
        # a NaN or a negative eps is wrong in every dtype: it gets its own class, not "overflow" or "zero"
        facts["eps_class"] = "invalid" if math.isnan(value) or value < 0 else classify(value, dtype.fmt)
    return facts
