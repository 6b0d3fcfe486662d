"""Keep-lists for PyTorch models: HF `_keep_in_fp32_modules`, an autocast(enabled=False) wrapper, Torch-TensorRT.

- transformers 5.24 (`core_model_loading.build_glob_alternation`, `modeling_utils._get_dtype_plan`) turns each
  `_keep_in_fp32_modules` entry into a regex (``*`` → ``.*``) *searched* in every parameter name when the model
  is loaded in float16: ``"wo"`` also matches ``word_embeddings``. An escaped, anchored entry
  (``^encoder\\.block\\.0\\.layer\\.1\\.DenseReluDense\\.wo\\.``) keeps exactly that module. Only the weights change
  dtype: the module's forward must cast its input (HF's T5 ``wo`` does); the autocast wrapper below does it for any
  module. transformers 4.x matched whole name segments instead (PR #26589): there a name keeps every module that
  has it.
- Torch-TensorRT's rule-based autocast (``enable_autocast=True``) takes ``nodes_to_exclude``: regexes on the
  torch.export graph's node names (``{"^conv2d$"}`` in its docs).
"""

from __future__ import annotations

import re

from ..escape import exact_regex
from .base import KeepArgs, py_list

__all__ = ["fx_name", "paste_autocast", "paste_hf", "paste_torch_tensorrt"]


def paste_hf(args: KeepArgs) -> str:
    anchored = [f"^{re.escape(m)}\\." if m else ".*" for m in args.modules]
    leaves = sorted({m.rsplit(".", 1)[-1] for m in args.modules if m})
    return "\n".join([
        "# transformers 5.x: each entry is a regex searched in the parameter names (loaded in float16)",
        f"_keep_in_fp32_modules = {py_list(anchored)}",
        "# set it on the model class before from_pretrained(..., dtype=torch.float16):",
        "#   MyModel._keep_in_fp32_modules = _keep_in_fp32_modules",
        "# the modules' forward must take float16 inputs to float32 weights (HF's T5 wo casts); otherwise use the",
        "# autocast wrapper (--for pytorch prints it too)",
        f"# transformers 4.x matches whole name segments: {py_list(leaves)} keeps every module with those names"])


def paste_autocast(args: KeepArgs) -> str:
    return "\n".join([
        "import torch",
        "",
        f"KEEP_FP32 = {py_list(args.modules)}",
        "",
        "def keep_in_fp32(model, names=KEEP_FP32):",
        "    \"\"\"Run these modules in float32, inputs cast up and outputs cast back, as the verified run did.\"\"\"",
        "    def cast(x, dtype):",
        "        return x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x",
        "    for name in names:",
        "        module = model.get_submodule(name).float()",
        "        def forward(*args, _forward=module.forward, **kwargs):",
        "            dtype = next((a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()), None)",
        "            with torch.autocast(device_type='cuda', enabled=False):",
        "                out = _forward(*(cast(a, torch.float32) for a in args),",
        "                               **{k: cast(v, torch.float32) for k, v in kwargs.items()})",
        "            return cast(out, dtype) if dtype is not None else out",
        "        module.forward = forward",
        "",
        "keep_in_fp32(model.half())"])


def fx_name(name: str) -> str:
    """The torch.export node name behind an IR node name (which may carry a body prefix and an op suffix)."""
    parts = name.split("/")
    if len(parts) > 1 and parts[-1].isalpha() and parts[-1].islower():
        parts = parts[:-1]  # "add_3/alpha": a second op precaudit lowered the FX node into
    return parts[-1]


def paste_torch_tensorrt(args: KeepArgs) -> str:
    regexes = sorted({exact_regex(fx_name(n)) for n in args.fx_nodes})
    return "\n".join([
        "import torch, torch_tensorrt",
        "trt_mod = torch_tensorrt.compile(",
        "    torch.export.export(model, inputs).module(),",
        "    arg_inputs=inputs,",
        "    use_explicit_typing=True,",
        "    enable_autocast=True,",
        "    low_precision_type=torch.float16,",
        f"    nodes_to_exclude={{{', '.join(repr(r) for r in regexes)}}},  # torch.export node names",
        ")"])
