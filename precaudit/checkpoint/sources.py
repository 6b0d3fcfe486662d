"""What CHECKPOINT names: one .safetensors file, a folder of shards, or a model.safetensors.index.json; its tensors
from every shard's header, and the quantization config beside it (config.json's quantization_config, else
ModelOpt's hf_quant_config.json).

An index is a stranger's file too: a shard it names must be a plain file name in the index's own folder (never a
path out of it), must exist, and must hold every tensor the index places in it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..files import MiB, read_bytes
from .header import MAX_HEADER, Shard, TensorInfo, load_json, read_header

__all__ = ["Checkpoint", "QuantSource", "open_checkpoint"]

INDEX_SUFFIX = ".safetensors.index.json"
CONFIG_LIMIT = 16 * MiB


@dataclass
class QuantSource:
    """The quantization config as a loader reads it, and the file and key it came from."""

    config: dict[str, Any]
    file: str
    key: str  # "quantization_config" (config.json) or "quantization" (hf_quant_config.json)


@dataclass
class Checkpoint:
    path: str
    shards: list[Shard]
    tensors: dict[str, TensorInfo]
    quant: QuantSource | None = None
    index: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # every shard's __metadata__, merged

    @property
    def size(self) -> int:
        return sum(s.size for s in self.shards)


def open_checkpoint(path: str) -> Checkpoint:
    """The checkpoint at path, every header read and checked; InputError for anything a loader would trip on."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(path, "no such file or folder") from None
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        folder = path
        index = _index_in(folder)
        shards = _from_index(index) if index else _from_folder(folder)
    elif path.endswith(".json"):
        folder, index = os.path.dirname(path) or ".", path
        shards = _from_index(index)
    else:
        folder, index = os.path.dirname(path) or ".", None
        shards = [read_header(path)]
    checkpoint = Checkpoint(path, shards, _merged(shards), _quant_source(folder), index)
    for shard in shards:
        checkpoint.metadata.update(shard.metadata)
    return checkpoint


def _index_in(folder: str) -> str | None:
    names = sorted(n for n in os.listdir(folder) if n.endswith(INDEX_SUFFIX))
    if "model" + INDEX_SUFFIX in names:
        return os.path.join(folder, "model" + INDEX_SUFFIX)
    if len(names) > 1:
        raise InputError(folder, f"holds {len(names)} index files ({', '.join(names[:3])}): name the one to scan")
    return os.path.join(folder, names[0]) if names else None


def _from_folder(folder: str) -> list[Shard]:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names:
        raise InputError(folder, "holds no .safetensors file and no index")
    return [read_header(os.path.join(folder, n)) for n in names]


def _from_index(index: str) -> list[Shard]:
    """The shards an index names, each checked to hold the tensors it places there; the index's map decides
    which shard's copy of a tensor counts, as it does for loaders."""
    document = load_json(index, read_bytes(index, MAX_HEADER, what="the index"), "the index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(index, "has no weight_map object of tensor name -> shard file name")
    folder = os.path.dirname(index) or "."
    shards = {}
    for name in sorted(set(weight_map.values())):
        if not name or name != os.path.basename(name) or name in (".", "..") or "\\" in name:
            raise InputError(index, f"names the shard {name!r}, which is not a file name in the index's folder")
        shard_path = os.path.join(folder, name)
        if not os.path.lexists(shard_path):
            raise InputError(index, f"names the shard {name!r}, and {shard_path} does not exist")
        shards[name] = read_header(shard_path)
    for tensor, name in weight_map.items():
        if tensor not in shards[name].tensors:
            raise InputError(shards[name].path, f"the index places tensor {tensor!r} in this shard, but its header "
                                                "has no such tensor")
    for name, shard in shards.items():  # a shard's tensors the index sends elsewhere (or nowhere) are not loaded
        shard.tensors = {t: info for t, info in shard.tensors.items() if weight_map.get(t) == name}
    return list(shards.values())


def _merged(shards: list[Shard]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        for name, info in shard.tensors.items():
            if name in tensors:
                raise InputError(shard.path, f"tensor {name!r} is also in {tensors[name].file}: a loader keeps one "
                                             "of the two silently")
            tensors[name] = info
    return tensors


def _quant_source(folder: str) -> QuantSource | None:
    """config.json's quantization_config (what loaders read first), else ModelOpt's hf_quant_config.json."""
    for name, key in (("config.json", "quantization_config"), ("hf_quant_config.json", "quantization")):
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            continue
        document = load_json(path, read_bytes(path, CONFIG_LIMIT, what=name), name)
        value = document.get(key) if isinstance(document, dict) else None
        if value is None:
            continue
        if not isinstance(value, dict):
            raise InputError(path, f"{key} is not a JSON object")
        if key == "quantization":  # hf_quant_config.json is ModelOpt's alone and does not say so itself
            value = {"quant_method": "modelopt", **value}
        return QuantSource(value, path, key)
    return None
