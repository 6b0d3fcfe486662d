"""precaudit scales on multi-GB checkpoints: bytes read against file size, and speed.

Writes in a temporary folder (never committed) one Llama-shaped checkpoint per layout (hidden 4096, MLP 14336,
layers enough for --size GB, sharded in --shards files with an index, bf16 embeddings and lm_head of a 32,000
vocabulary): weights as holes of sparse files (no disk, and never read by the scan), scales as real bytes (valid
values, and for NVFP4 one NaN planted in the last layer's down_proj scale to show the count). Evicts the files from the page
cache (fsync + posix_fadvise DONTNEED), scans each, and prints:

  read/size     the bytes the scan read (headers + scale tensors) against the checkpoint's size
  rchar         the same bytes as the kernel counted them (/proc/self/io rchar over the scan): a cross-check
  scales/quant  the layout's scale bytes against its quantized weights' bytes: what any exact count must read
  GB/s          checkpoint GB scanned per second (size / time), and the read rate (bytes read / time)

    python benchmarks/scales_speed.py [--size 4] [--shards 4] [--layouts nvfp4,fp8,...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from precaudit.checkpoint import scan

HIDDEN, MLP, VOCAB = 4096, 14336, 32000
LINEARS = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (1024, HIDDEN),
           "self_attn.v_proj": (1024, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
           "mlp.gate_proj": (MLP, HIDDEN), "mlp.up_proj": (MLP, HIDDEN), "mlp.down_proj": (HIDDEN, MLP)}
BITS = {"U8": 8, "F8_E4M3": 8, "F32": 32, "F16": 16, "BF16": 16, "I32": 32, "I64": 64}
Filler = Callable[[int], bytes] | None  # the tensor's bytes, or None: a hole


def _e4m3(n: int) -> bytes:  # positive normal E4M3 codes 0x08..0x7E
    return np.random.default_rng(n).integers(0x08, 0x7F, size=n, dtype=np.uint8).tobytes()


def _e8m0(n: int) -> bytes:
    return np.random.default_rng(n).integers(110, 135, size=n, dtype=np.uint8).tobytes()


def _float(dtype: str, low: float, high: float) -> Callable[[int], bytes]:
    numpy_type = {"F32": np.float32, "F16": np.float16}[dtype]
    return lambda n: np.random.default_rng(n).uniform(low, high, size=n // np.dtype(numpy_type).itemsize) \
        .astype(numpy_type).tobytes()


def linear(layout: str, out: int, inp: int) -> list[tuple[str, str, tuple[int, ...], Filler]]:
    """One linear's tensors in the layout: (leaf, dtype, shape, filler)."""
    scalar = _float("F32", 0.001, 0.002)
    if layout == "nvfp4":
        return [("weight", "U8", (out, inp // 2), None), ("weight_scale", "F8_E4M3", (out, inp // 16), _e4m3),
                ("weight_scale_2", "F32", (), scalar), ("input_scale", "F32", (), scalar)]
    if layout == "fp8":
        return [("weight", "F8_E4M3", (out, inp), None), ("weight_scale", "F32", (), scalar),
                ("input_scale", "F32", (), scalar)]
    if layout == "fp8-block":
        return [("weight", "F8_E4M3", (out, inp), None),
                ("weight_scale_inv", "F32", (math.ceil(out / 128), math.ceil(inp / 128)), scalar)]
    if layout == "mxfp4":
        return [("weight_packed", "U8", (out, inp // 2), None), ("weight_scale", "U8", (out, inp // 32), _e8m0)]
    if layout == "w4a16":
        return [("weight_packed", "I32", (out, inp // 8), None),
                ("weight_scale", "F16", (out, inp // 128), _float("F16", 1e-3, 2e-2)),
                ("weight_shape", "I64", (2,), lambda n: np.array([out, inp], dtype=np.int64).tobytes())]
    raise SystemExit(f"unknown layout {layout!r}")


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * BITS[dtype] // 8


def plan(layout: str, size_gb: float) -> tuple[list[tuple[str, str, tuple[int, ...], Filler]], int]:
    """Every tensor of the checkpoint, and its number of layers."""
    per_layer = sum(_nbytes(d, s) for out, inp in LINEARS.values() for _, d, s, _ in linear(layout, out, inp))
    layers = max(1, round((size_gb * 1e9 - 2 * VOCAB * HIDDEN * 2) / per_layer))
    tensors: list[tuple[str, str, tuple[int, ...], Filler]] = [
        ("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN), None)]
    for i in range(layers):
        for module, (out, inp) in LINEARS.items():
            tensors += [(f"model.layers.{i}.{module}.{leaf}", d, s, f) for leaf, d, s, f in linear(layout, out, inp)]
    tensors.append(("lm_head.weight", "BF16", (VOCAB, HIDDEN), None))
    return tensors, layers


CONFIGS = {"nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                     "ignore": ["lm_head"]},
           "fp8": {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]},
           "fp8-block": {"quant_method": "fp8", "weight_block_size": [128, 128]},
           "mxfp4": {"quant_method": "compressed-tensors", "config_groups": {"g": {
               "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 32}}}},
           "w4a16": {"quant_method": "compressed-tensors", "config_groups": {"g": {
               "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}}


def write_checkpoint(folder: Path, layout: str, size_gb: float, shards: int) -> tuple[Path, int]:
    tensors, layers = plan(layout, size_gb)
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(_nbytes(d, s) for _, d, s, _ in tensors)
    per_shard, groups, current, used = total / shards, [], [], 0
    for t in tensors:
        current.append(t)
        used += _nbytes(t[1], t[2])
        if used >= per_shard * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(current)
            current = []
    groups.append(current)
    weight_map = {}
    planted = f"model.layers.{layers - 1}.mlp.down_proj.weight_scale" if layout == "nvfp4" else None
    for k, group in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        _write_shard(folder / name, group, planted)
        weight_map.update({t[0]: name for t in group})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"quantization_config": CONFIGS[layout]}))
    return folder, layers


def _write_shard(path: Path, tensors: list[tuple[str, str, tuple[int, ...], Filler]], planted: str | None) -> None:
    header, offset = {}, 0
    for name, dtype, shape, _ in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + _nbytes(dtype, shape)]}
        offset += _nbytes(dtype, shape)
    text = json.dumps(header).encode()
    start = 8 + len(text)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little") + text)
        fh.truncate(start + offset)  # the weights: holes
        for name, dtype, shape, fill in tensors:
            if fill is not None:
                data = bytearray(fill(_nbytes(dtype, shape)))
                if name == planted:
                    data[7] = 0x7F  # one E4M3 NaN
                fh.seek(start + header[name]["data_offsets"][0])
                fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _evict(folder: Path) -> None:
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def measure(folder: Path, layout: str, layers: int) -> None:
    _evict(folder)
    before = _rchar()
    started = time.perf_counter()
    report = scan(folder)
    seconds = time.perf_counter() - started
    rchar = _rchar() - before
    quantized = sum(t.tensor.nbytes for t in report.tensors)
    weights = sum(out * inp for out, inp in LINEARS.values()) * layers * {"nvfp4": 0.5, "fp8": 1, "fp8-block": 1,
                                                                          "mxfp4": 0.5, "w4a16": 0.5}[layout]
    nan = sum(t.counts.nan for t in report.tensors if t.counts)
    print(f"{layout:<10} {len(report.files):>3} {report.bytes_total / 1e9:>7.2f} {len(report.tensors):>7,} "
          f"{report.bytes_read:>14,} {rchar:>14,} {100 * report.bytes_read / report.bytes_total:>9.4f}% "
          f"{100 * quantized / weights:>9.3f}% {seconds:>7.2f} {report.bytes_total / 1e9 / seconds:>8.1f} "
          f"{report.bytes_read / 1e9 / seconds:>8.3f} {nan:>4}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=float, default=4.0, help="GB per checkpoint (default 4)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--layouts", default="nvfp4,fp8,fp8-block,mxfp4,w4a16")
    parser.add_argument("--keep", type=Path, help="write the checkpoints here and keep them")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="scales_speed."))
    scan(write_checkpoint(root / "warmup", "nvfp4", 0.3, 1)[0])  # imports and lookup tables, outside the timing
    print(f"{'layout':<10} {'files':>3} {'GB':>7} {'scales':>7} {'bytes read':>14} {'rchar':>14} "
          f"{'read/size':>10} {'scales/quant':>10} {'seconds':>7} {'GB/s':>8} {'read GB/s':>8} {'NaN':>4}")
    try:
        for layout in args.layouts.split(","):
            folder, layers = write_checkpoint(root / layout, layout, args.size, args.shards)
            measure(folder, layout, layers)
            if args.keep is None:
                for path in folder.iterdir():
                    path.unlink()
    finally:
        if args.keep is None:
            import shutil
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
