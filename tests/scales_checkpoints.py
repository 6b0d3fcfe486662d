"""Checkpoints for tests/test_scales*.py, built in code: a safetensors writer (the format: an 8-byte little-endian
header length, the JSON header, the tensors' bytes) and one builder per layout, with clean scales that the tests
plant NaN, inf, zero and subnormal entries into at known places."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
          np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
          np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
          np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
E4M3 = ml_dtypes.float8_e4m3fn


def header_and_data(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> tuple[dict, bytes]:
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    data = bytearray()
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return header, bytes(data)


def raw_file(path: Path, header_text: str | bytes, data: bytes = b"", length: int | None = None) -> Path:
    """A file with exactly this header text (and a header length field that may lie)."""
    text = header_text.encode() if isinstance(header_text, str) else header_text
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def write(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None,
          config: dict | None = None) -> Path:
    """A .safetensors file of these tensors (in order), and config.json beside it if given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header, data = header_and_data(tensors, metadata)
    raw_file(path, json.dumps(header), data)
    if config is not None:
        (path.parent / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": config}))
    return path


def e4m3(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(E4M3)


def block_scales(rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Clean E4M3 block scales: normal values from 1 to 448."""
    rng = np.random.default_rng(seed)
    return e4m3(rng.uniform(1.0, 448.0, size=(rows, columns)))


def codes(array: np.ndarray) -> np.ndarray:
    """The raw bytes of an 8-bit array, to plant a code (0x7F, 0xFF, ...) at a place."""
    return array.view(np.uint8)


def modelopt_nvfp4(out: int, inp: int, seed: int = 0, input_scale: bool = True) -> dict[str, np.ndarray]:
    """One ModelOpt NVFP4 linear's tensors, by leaf name."""
    rng = np.random.default_rng(seed)
    parts = {"weight": rng.integers(0, 256, size=(out, inp // 2), dtype=np.uint8),
             "weight_scale": block_scales(out, inp // 16, seed),
             "weight_scale_2": np.array(0.0021, dtype=np.float32)}
    if input_scale:
        parts["input_scale"] = np.array(0.013, dtype=np.float32)
    return parts


def compressed_nvfp4(out: int, inp: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"weight_packed": rng.integers(0, 256, size=(out, inp // 2), dtype=np.uint8),
            "weight_scale": block_scales(out, inp // 16, seed),
            "weight_global_scale": np.array([1344.0], dtype=np.float32),
            "input_global_scale": np.array([210.0], dtype=np.float32)}


def compressed_w4a16(out: int, inp: int, group: int = 128, seed: int = 0) -> dict[str, np.ndarray]:
    """compressed-tensors pack-quantized (GPTQ W4A16): eight int4 a int32, float16 group scales."""
    rng = np.random.default_rng(seed)
    return {"weight_packed": rng.integers(-2**31, 2**31, size=(out, inp // 8), dtype=np.int64).astype(np.int32),
            "weight_scale": rng.uniform(1e-3, 2e-2, size=(out, inp // group)).astype(np.float16),
            "weight_shape": np.array([out, inp], dtype=np.int64)}


def modelopt_fp8(out: int, inp: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"weight": rng.uniform(-448, 448, size=(out, inp)).astype(np.float32).astype(E4M3),
            "weight_scale": np.array(0.00052, dtype=np.float32),
            "input_scale": np.array(0.021, dtype=np.float32)}


def gpt_oss_mxfp4(experts: int, out: int, inp: int, seed: int = 0) -> dict[str, np.ndarray]:
    """transformers' MXFP4 experts: 16 bytes (32 FP4 values) a block, an E8M0 code a block (127 = 1.0)."""
    rng = np.random.default_rng(seed)
    return {"blocks": rng.integers(0, 256, size=(experts, out, inp // 32, 16), dtype=np.uint8),
            "scales": rng.integers(110, 130, size=(experts, out, inp // 32), dtype=np.uint8)}


def torchao_mxfp8(module: str, out: int, inp: int, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """torchao's MXTensor as its safetensors support flattens it: {module}._weight_qdata / _weight_scale, and the
    subclass described in __metadata__."""
    rng = np.random.default_rng(seed)
    scale = rng.integers(115, 135, size=(out, inp // 32), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    tensors = {f"{module}._weight_qdata": rng.uniform(-448, 448, size=(out, inp)).astype(np.float32).astype(E4M3),
               f"{module}._weight_scale": scale}
    meta = {"_type": "MXTensor", "_data": {"_elem_dtype": {"_type": "torch.dtype", "_data": "float8_e4m3fn"},
                                           "block_size": 32, "_is_swizzled_scales": False},
            "_tensor_data_names": ["qdata", "scale"]}
    metadata = {"tensor_names": json.dumps([f"{module}.weight"]), f"{module}.weight": json.dumps(meta)}
    return tensors, metadata


def named(prefix: str, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{prefix}.{leaf}": array for leaf, array in parts.items()}
