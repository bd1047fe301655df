"""Whether an unpickled DCP ``Metadata`` is well-formed, and whether its chunks tile each tensor exactly."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .limits import MAX_INT64, MAX_TENSOR_DIMS
from .values import clip


def metadata_problem(metadata: Any, classes: Mapping[tuple[str, str], Any]) -> str | None:
    """Why an unpickled Metadata cannot be walked by the checks, or None when it can.

    The allowlist bounds which classes exist, not what their attributes hold: a pickle can give any allowed object
    any attributes, so every field the checks read is checked for type and range first.
    """
    module = "torch.distributed.checkpoint.metadata"
    tensor_cls, bytes_cls = classes[(module, "TensorStorageMetadata")], classes[(module, "BytesStorageMetadata")]
    chunk_cls, index_cls = classes[(module, "ChunkStorageMetadata")], classes[(module, "MetadataIndex")]
    info_cls = classes[("torch.distributed.checkpoint.filesystem", "_StorageInfo")]
    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(items, dict):
        return f"state_dict_metadata is a {type(items).__name__}, not a dict"
    problem = _items_problem(items, tensor_cls, bytes_cls, chunk_cls)
    storage = getattr(metadata, "storage_data", None)
    if problem is not None or not isinstance(storage, dict):
        return problem  # a storage_data that is no dict: check_storage says so, in the words it always has
    return _storage_problem(storage, index_cls, info_cls)


def _items_problem(items: dict[Any, Any], tensor_cls: Any, bytes_cls: Any, chunk_cls: Any) -> str | None:
    """Why a state_dict_metadata entry is not a tensor's size and chunk list (or bytes), or None."""
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            return f"a state_dict_metadata key is a {type(fqn).__name__}, not a string"
        if type(item) is bytes_cls:
            continue
        if type(item) is not tensor_cls:
            return f"{clip(fqn)} is described by a {type(item).__name__}"
        chunks = getattr(item, "chunks", None)
        if not is_dims(getattr(item, "size", None)) or not isinstance(chunks, list):
            return f"{clip(fqn)} has no valid size or chunk list"
        for chunk in chunks:
            if type(chunk) is not chunk_cls or not (
                is_dims(getattr(chunk, "offsets", None)) and is_dims(getattr(chunk, "sizes", None))
            ):
                return f"{clip(fqn)} has a chunk without valid offsets and sizes"
    return None


def _storage_problem(storage: dict[Any, Any], index_cls: Any, info_cls: Any) -> str | None:
    """Why a storage_data entry is not an index (fqn, offset) to a file name, an offset and a length, or None."""
    for index, info in storage.items():
        offset = getattr(index, "offset", None)
        if type(index) is not index_cls or not isinstance(getattr(index, "fqn", None), str):
            return f"a storage_data key is a {type(index).__name__} without a string fqn"
        if offset is not None and not is_dims(offset):
            return f"the storage entry of {clip(index.fqn)} has an invalid offset"
        fields = [getattr(info, name, None) for name in ("relative_path", "offset", "length")]
        if type(info) is not info_cls or not isinstance(fields[0], str) or not all(map(is_int64, fields[1:])):
            return f"the storage entry of {clip(index.fqn)} is not a file name, an offset and a length"
    return None


def is_int64(value: Any) -> bool:
    return type(value) is int and -MAX_INT64 <= value <= MAX_INT64


def is_dims(value: Any) -> bool:
    """A torch.Size-like tuple of int64s with no more dimensions than torch allows."""
    return isinstance(value, tuple) and len(value) <= MAX_TENSOR_DIMS and all(map(is_int64, value))


class Budget:
    """Pairwise chunk comparisons left for one DCP directory: a crafted layout must not make the check quadratic."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.exhausted = False

    def spend(self) -> bool:
        """Take one comparison; False (and exhausted) once none is left."""
        self.left -= 1
        if self.left < 0:
            self.exhausted = True
        return not self.exhausted


def coverage_problem(
    size: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]], budget: Budget
) -> str | None:
    """Why the chunks do not tile a tensor of this size exactly, or None when they do."""
    ndim = len(size)
    for offsets, sizes in chunks:
        if len(offsets) != ndim or len(sizes) != ndim:
            return f"chunk at offsets {list(offsets)} has {len(sizes)} dimension(s), the tensor {ndim}"
        # An empty chunk (a rank with no rows of an unevenly sharded tensor) holds no data wherever it points.
        outside = math.prod(sizes) and any(o < 0 or o + s > d for o, s, d in zip(offsets, sizes, size, strict=True))
        if outside or any(s < 0 for s in sizes):
            return f"chunk at offsets {list(offsets)} of sizes {list(sizes)} is out of bounds"
    boxes = [(o, s) for o, s in chunks if math.prod(s) > 0]
    if ndim and not budget.exhausted:
        # Sweep along the dimension with the most distinct offsets (FSDP shards dim 0, TP often dim 1): sorted by
        # offset there, a chunk can only overlap the chunks after it that start before it ends in that dimension.
        axis = max(range(ndim), key=lambda d: len({o[d] for o, _ in boxes}))
        boxes.sort(key=lambda box: (box[0][axis], box[0]))
        for i, (oa, sa) in enumerate(boxes):
            for ob, sb in boxes[i + 1 :]:
                if ob[axis] >= oa[axis] + sa[axis]:
                    break
                if not budget.spend():
                    return None  # reported once per directory by check_chunks
                if all(ob[d] < oa[d] + sa[d] and oa[d] < ob[d] + sb[d] for d in range(ndim)):
                    first, second = sorted((oa, ob))
                    return f"chunks at offsets {list(first)} and {list(second)} overlap"
    covered, volume = sum(math.prod(s) for _, s in chunks), math.prod(size)
    if covered != volume:
        return f"its chunks cover {covered} of its {volume} elements"
    return None
