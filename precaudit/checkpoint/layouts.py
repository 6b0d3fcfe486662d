"""Which tensors are one quantized weight and its scales, and in which layout, from names, dtypes and the config.

    layout                    weight                      block or weight scale         global scale
    modelopt-nvfp4            weight U8 [out, in/2]       weight_scale F8_E4M3          weight_scale_2 F32,
                                                          [out, in/16]                  amax/(6*448)
    compressed-tensors-nvfp4  weight_packed U8            weight_scale F8_E4M3          weight_global_scale F32,
                              [out, in/2]                 [out, in/16]                  (6*448)/amax
    compressed-tensors-mxfp4  weight_packed U8            weight_scale U8 (E8M0)
                              [out, in/2]                 [out, in/32]
    mxfp8 (ModelOpt and       weight F8_E4M3 [out, in]    weight_scale U8 or F8_E8M0
      compressed-tensors)                                 [out, in/32]
    modelopt-fp8,             weight F8                   weight_scale F32: [], [1],
      compressed-tensors-fp8                              [out, 1] or 128x128 blocks
    fp8-block (transformers)  weight F8 [out, in]         weight_scale_inv F32
                                                          [ceil(out/128), ceil(in/128)]
    compressed-tensors-int    weight_packed I32           weight_scale [out, in/group]
                              [out, in*bits/32]           (weight_shape holds [out, in])
    int4 (a config's INT4)    weight U8/I8 [out, in/2]    weight_scale [out, in/group]
    int8                      weight I8                   weight_scale
    mxfp4 (transformers,      X_blocks U8                 X_scales U8 (E8M0)
      gpt-oss)                [..., in/32, 16]            [..., in/32]
    torchao-*                 {module}._weight_qdata      {module}._weight_scale, ... (__metadata__ names them)

input_scale (ModelOpt, compressed-tensors FP8), input_global_scale (compressed-tensors NVFP4), k_scale/v_scale and
pre_quant_scale are the module's other scales. A module whose weight is stored quantized but whose layout needs a
scale it lacks is a unit with that scale missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .config import QuantConfig, positive_ints
from .header import TensorInfo

__all__ = ["SCALE_ROLES", "Part", "Unit", "find_units"]

FP8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
CODES = ("U8", "F8_E8M0")  # E8M0 scales: a byte each, stored as U8 or F8_E8M0
SCALE_ROLES = ("block", "scale", "global", "input", "kv", "smooth")
# role of every scale-like leaf name a module may have
LEAF_ROLES = {"weight_scale": "scale", "weight_scale_inv": "scale", "weight_scale_2": "global",
              "weight_global_scale": "global", "input_scale": "input", "input_global_scale": "input",
              "k_scale": "kv", "v_scale": "kv", "q_scale": "kv", "prob_scale": "kv", "pre_quant_scale": "smooth"}
_TORCHAO = ("MXTensor", "NVFP4Tensor", "Float8Tensor", "Int8Tensor", "Int4Tensor", "Int4PlainInt32Tensor",
            "Int4TilePackedTo4dTensor", "IntxUnpackedToInt8Tensor", "Int4OpaqueTensor")


@dataclass
class Part:
    tensor: TensorInfo
    role: str    # weight, block, scale, global, input, kv, smooth, aux
    decode: str  # the format its bytes are read in: its dtype, or F8_E4M3 / F8_E8M0 for a U8 scale


@dataclass
class Unit:
    """One quantized weight (or one module's scales when no layout is recognised) and how it is stored."""

    name: str
    module: str  # what the config's targets name
    layout: str | None
    family: str | None
    parts: dict[str, Part] = field(default_factory=dict)  # by leaf name
    block: int | None = None  # weight elements per block scale along in_features
    pack: int = 1  # weight elements per stored element on the last axis: 2 for FP4 in a byte
    convention: str | None = None  # how the global scale is stored: "amax/(6*448)" or "(6*448)/amax"
    missing: list[str] = field(default_factory=list)  # leaves the layout needs and the checkpoint lacks
    evidence: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # swizzled, fp8 block shape, torchao block_size

    def part(self, role: str) -> Part | None:
        return next((p for p in self.parts.values() if p.role == role), None)


def find_units(tensors: dict[str, TensorInfo], metadata: dict[str, str], config: QuantConfig | None) -> list[Unit]:
    """Every quantized weight with its scales, and every other module's scale tensors."""
    pool = dict(tensors)
    units = _torchao_units(pool, metadata)
    modules: dict[str, dict[str, TensorInfo]] = {}
    for name, info in pool.items():
        module, _, leaf = name.rpartition(".")
        modules.setdefault(module, {})[leaf] = info
    found: list[Unit] = []
    weak: dict[str, dict[str, TensorInfo]] = {}
    for module, leaves in modules.items():
        found.extend(_mx_units(module, leaves))
        unit = _standard_unit(module, leaves, config)
        weight = leaves.get("weight")
        if (unit is None or unit.layout is None) and weight is not None and weight.dtype == "U8":
            weak[module] = leaves
        if unit is not None:
            found.append(unit)
    # a U8 weight with no block scale is an NVFP4 weight whose scales are missing where the config or the rest of
    # the checkpoint is ModelOpt NVFP4 (an expert never calibrated); elsewhere it is any byte tensor
    nvfp4 = any(u.layout == "modelopt-nvfp4" for u in found)
    families = {module: _config_family(config, module) for module in weak}
    missing = {module: _modelopt_nvfp4(module, leaves, config) for module, leaves in weak.items()
               if families[module] == "nvfp4" or (families[module] is None and nvfp4)}
    units += [missing.pop(u.module, u) if u.layout is None else u for u in found]
    units += missing.values()
    return units


def _config_family(config: QuantConfig | None, module: str) -> str | None:
    if config is None or config.ignored_by(module) is not None:
        return None
    claimants = config.claimants(module)
    return claimants[0].family if claimants else None


def _config_size(config: QuantConfig | None, module: str) -> int | None:
    claimants = config.claimants(module) if config is not None else []
    return claimants[0].group_size if claimants else None


def _parts(leaves: dict[str, TensorInfo], roles: dict[str, str], decode: dict[str, str] | None = None
           ) -> dict[str, Part]:
    decode = decode or {}  # a U8 scale's bytes in its layout's format; any other dtype is read as declared
    return {leaf: Part(t, roles.get(leaf, LEAF_ROLES.get(leaf, "aux")),
                       decode.get(leaf, t.dtype) if t.dtype == "U8" else t.dtype)
            for leaf, t in leaves.items()}


def _require(unit: Unit, leaves: dict[str, TensorInfo], *required: str) -> Unit:
    unit.missing = [leaf for leaf in required if leaf not in leaves]
    return unit


def _modelopt_nvfp4(module: str, leaves: dict[str, TensorInfo], config: QuantConfig | None) -> Unit:
    unit = Unit(module + ".weight", module, "modelopt-nvfp4", "nvfp4",
                _parts(leaves, {"weight": "weight", "weight_scale": "block"}, {"weight_scale": "F8_E4M3"}),
                block=_config_size(config, module) or 16, pack=2, convention="amax/(6*448)",
                evidence="weight U8 + weight_scale + weight_scale_2")
    return _require(unit, leaves, "weight", "weight_scale", "weight_scale_2")


def _standard_unit(module: str, leaves: dict[str, TensorInfo], config: QuantConfig | None) -> Unit | None:
    """The unit of a module with HF-style leaves (weight, weight_packed, weight_scale, ...), if it has any."""
    packed = leaves.get("weight_packed")
    weight = packed or leaves.get("weight")
    scale = leaves.get("weight_scale")
    family = _config_family(config, module)
    if weight is None or (weight.dtype not in ("U8", "I8", "I32", *FP8)):
        return _scales_only(module, leaves)
    if family == "int4" and packed is None and weight.dtype in ("U8", "I8"):  # ModelOpt's INT4 AWQ: two a byte
        unit = Unit(module + ".weight", module, "int4", "int4",
                    _parts(leaves, {"weight": "weight", "weight_scale": "block"}),
                    block=_config_size(config, module), pack=2, evidence="weight packed int4 + weight_scale (config)")
        return _require(unit, leaves, "weight", "weight_scale")
    if packed is None and weight.dtype == "U8" and ("weight_scale_2" in leaves or
                                                    (scale is not None and scale.dtype in (*FP8, "U8"))):
        return _modelopt_nvfp4(module, leaves, config)
    if packed is not None:
        return _compressed_tensors(module, leaves, packed, family, config)
    if weight.dtype in FP8:
        return _fp8(module, leaves, family, config)
    if weight.dtype == "I8" and (scale is not None or family == "int8"):
        unit = Unit(module + ".weight", module, "int8", "int8", _parts(leaves, {"weight": "weight"}),
                    evidence="weight I8 + weight_scale")
        return _require(unit, leaves, "weight", "weight_scale")
    return _scales_only(module, leaves)


def _scales_only(module: str, leaves: dict[str, TensorInfo]) -> Unit | None:
    """A module's scale tensors where no layout is recognised: counted all the same."""
    scales = {leaf: t for leaf, t in leaves.items() if leaf in LEAF_ROLES}
    if not scales:
        return None
    return Unit(module, module, None, None, _parts(scales, {}), evidence="scale names, no quantized weight known")


def _compressed_tensors(module: str, leaves: dict[str, TensorInfo], packed: TensorInfo, family: str | None,
                        config: QuantConfig | None) -> Unit:
    scale = leaves.get("weight_scale")
    roles = {"weight_packed": "weight", "weight_scale": "block", "weight_shape": "aux"}
    size = _config_size(config, module)
    if packed.dtype == "I32":
        bits = 8 if family == "int8" else 4
        unit = Unit(module + ".weight", module, "compressed-tensors-int", f"int{bits}", _parts(leaves, roles),
                    block=size, pack=32 // bits, evidence=f"weight_packed I32 ({bits}-bit) + weight_scale")
        return _require(unit, leaves, "weight_packed", "weight_scale")
    if (scale is not None and scale.dtype in CODES) or family == "mxfp4":
        unit = Unit(module + ".weight", module, "compressed-tensors-mxfp4", "mxfp4",
                    _parts(leaves, roles, {"weight_scale": "F8_E8M0"}), block=32, pack=2,
                    evidence="weight_packed U8 + weight_scale U8 (E8M0)")
        return _require(unit, leaves, "weight_packed", "weight_scale")
    unit = Unit(module + ".weight", module, "compressed-tensors-nvfp4", "nvfp4",
                _parts(leaves, roles, {"weight_scale": "F8_E4M3"}),
                block=size or 16, pack=2, convention="(6*448)/amax",
                evidence="weight_packed U8 + weight_scale + weight_global_scale")
    return _require(unit, leaves, "weight_packed", "weight_scale", "weight_global_scale")


def _fp8(module: str, leaves: dict[str, TensorInfo], family: str | None, config: QuantConfig | None) -> Unit:
    roles = {"weight": "weight"}
    if "weight_scale_inv" in leaves:
        block = config.claimants(module)[0].block if config and config.claimants(module) else None
        unit = Unit(module + ".weight", module, "fp8-block", "fp8", _parts(leaves, roles),
                    evidence="weight F8 + weight_scale_inv", options={"fp8_block": block or (128, 128)})
        return _require(unit, leaves, "weight", "weight_scale_inv")
    scale = leaves.get("weight_scale")
    if (scale is not None and scale.dtype in CODES) or family == "mxfp8":
        unit = Unit(module + ".weight", module, "mxfp8", "mxfp8",
                    _parts(leaves, {"weight": "weight", "weight_scale": "block"}, {"weight_scale": "F8_E8M0"}),
                    block=32, evidence="weight F8 + weight_scale U8 (E8M0)")
        return _require(unit, leaves, "weight", "weight_scale")
    method = config.method if config else ""
    name = {"modelopt": "modelopt-fp8", "compressed-tensors": "compressed-tensors-fp8"}.get(method, "fp8")
    claimants = config.claimants(module) if config else []
    unit = Unit(module + ".weight", module, name, "fp8", _parts(leaves, roles),
                evidence="weight F8 + weight_scale", options={"fp8_block": claimants[0].block if claimants else None})
    return _require(unit, leaves, "weight", "weight_scale")


def _mx_units(module: str, leaves: dict[str, TensorInfo]) -> list[Unit]:
    """transformers' MXFP4 (gpt-oss): X_blocks U8 [..., G, 16] and X_scales U8 [..., G], 32 values a block."""
    units = []
    for base in dict.fromkeys(leaf.rpartition("_")[0] for leaf in leaves if leaf.endswith(("_blocks", "_scales"))):
        found = {k: leaves[k] for k in (base + "_blocks", base + "_scales") if k in leaves}
        if any(t.dtype not in CODES for t in found.values()):
            continue
        unit = Unit(f"{module}.{base}", module, "mxfp4", "mxfp4",
                    _parts(found, {base + "_blocks": "weight", base + "_scales": "block"},
                           {base + "_scales": "F8_E8M0"}),
                    block=32, pack=2, evidence=f"{base}_blocks U8 + {base}_scales U8 (E8M0)")
        units.append(_require(unit, found, base + "_blocks", base + "_scales"))
        for k in found:
            del leaves[k]
    return units


def _torchao_units(pool: dict[str, TensorInfo], metadata: dict[str, str]) -> list[Unit]:
    """torchao's flattened tensor subclasses: __metadata__ lists each subclass tensor and its data names, stored as
    {module}._{attribute}_{data name}; the units' tensors leave the pool."""
    names = _json(metadata.get("tensor_names"))
    units = []
    for tensor_name in names if isinstance(names, list) else []:
        meta = _json(metadata.get(tensor_name)) if isinstance(tensor_name, str) else None
        if not isinstance(meta, dict) or meta.get("_type") not in _TORCHAO or "." not in tensor_name:
            continue
        module, attribute = tensor_name.rsplit(".", 1)
        data_names = [d for d in meta.get("_tensor_data_names") or [] if isinstance(d, str)]
        stored = {d: f"{module}._{attribute}_{d}" for d in data_names}
        found = {d: pool.pop(n) for d, n in stored.items() if n in pool}
        units.append(_torchao_unit(tensor_name, module, meta, found, data_names))
    return units


def _torchao_unit(name: str, module: str, meta: dict, found: dict[str, TensorInfo], data: list[str]) -> Unit:
    kind = meta["_type"]
    attrs: dict[str, Any] = meta["_data"] if isinstance(meta.get("_data"), dict) else {}
    roles = {d: _torchao_role(d) for d in found}
    elem = str(_unwrap(attrs.get("_elem_dtype") or attrs.get("elem_dtype")) or "")
    block = _unwrap(attrs.get("block_size", attrs.get("_block_size")))
    swizzled = bool(_unwrap(attrs.get("is_swizzled_scales", attrs.get("_is_swizzled_scales"))))
    family: str | None
    decode: str | None
    convention: str | None
    if kind == "NVFP4Tensor":
        family, decode, convention = "nvfp4", "F8_E4M3", "amax/(6*448)"
    elif kind == "MXTensor":
        family, decode, convention = ("mxfp4" if "float4" in elem else "mxfp8"), "F8_E8M0", None
    else:
        family, decode, convention = ("fp8" if kind == "Float8Tensor" else None), None, None
    qdata = found.get("qdata")
    pack = 2 if family in ("nvfp4", "mxfp4") and qdata is not None and qdata.dtype == "U8" else 1
    block_list = positive_ints(block)
    block = block if type(block) is int and block > 0 else None
    unit = Unit(name, module, f"torchao-{kind}", family,
                {d: Part(t, roles[d], decode if roles[d] == "block" and decode and t.dtype in ("U8", *CODES)
                         else t.dtype) for d, t in found.items()},
                block=block, pack=pack, convention=convention, evidence=f"__metadata__ {kind} ({', '.join(data)})",
                options={"swizzled": swizzled, "block_size": block_list})
    unit.missing = [f"{module}._{name.rsplit('.', 1)[1]}_{d}" for d in data if d not in found]
    return unit


def _torchao_role(data_name: str) -> str:
    if data_name == "qdata":
        return "weight"
    if "per_tensor_scale" in data_name:
        return "input" if data_name.lstrip("_").startswith("act") else "global"
    return "block" if "scale" in data_name else "aux"


def _unwrap(value: Any) -> Any:
    """torchao writes a torch.dtype or an enum as {"_type": ..., "_data": value}."""
    return value.get("_data") if isinstance(value, dict) else value


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


_DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)")


def sibling_pattern(name: str) -> str:
    """The name with its numbered parts (layer, expert) starred: model.layers.*.mlp.experts.*.down_proj."""
    return _DIGITS.sub("*", name)
