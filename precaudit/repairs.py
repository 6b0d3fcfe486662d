"""The repair kinds `precaudit fix` knows: what a rule's `repair:` key may name (data only: fixer/planner.py maps
each kind to the code that makes it, and a user's rule may reuse any of them on the site kinds it fits)."""

from __future__ import annotations

__all__ = ["NORM_KINDS", "REPAIR_KINDS"]

REPAIR_KINDS = {
    "eps-raise": "the eps becomes the smallest normal number of its compute dtype (or --min-eps); on a fused norm "
                 "with stash_type=0, stash_type=1; in a model stored in float16, the norm's statistics in float32",
    "eps-inside-root": "sqrt(var) + eps becomes sqrt(var + eps)",
    "eps-add": "an Add(var, eps) before the root, or Max(norm, eps) after a ReduceL2",
    "norm-float32": "Casts to float32 around a decomposed norm stored in float16 or bfloat16",
    "log-softmax": "Log(Softmax(x)) becomes LogSoftmax(x)",
    "log-sigmoid": "Log(Sigmoid(x)) becomes -Softplus(-x)",
    "max-shift": "exp(x) / sum(exp(x)) of x - max(x)",
    "logsumexp-shift": "log(sum(exp(x))) becomes max(x) + log(sum(exp(x - max(x))))",
    "guard": "Max(x, c) before a Log, Sqrt, Div or Reciprocal; a floor on data only with --data-floor",
    "mask-fill": "the fill becomes the target's own finfo.min",
}
# the kinds one norm's findings share: planned together, by the norm repair (fixer/eps.py)
NORM_KINDS = ("eps-raise", "eps-inside-root", "eps-add", "norm-float32")
