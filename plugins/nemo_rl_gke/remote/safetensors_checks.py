"""The checks of the v2 worker's Automodel safetensors: each rank's sharded file, the HF metadata, the consolidated
Hugging Face copy.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's ``dtype``, ``shape`` and
``data_offsets`` in the data that follows, and a ``__metadata__`` map of strings), then the data. In a sharded save,
torch's Hugging Face writer (and Automodel's backport of it) puts each rank's piece of every tensor in that rank's
file and records where the piece sits in the full tensor under ``__metadata__["DCP_SHARDING_INFO"]``: JSON text of
``{fqn: {"saved_offsets": [...]}}``. The header is parsed with the standard library only: nothing is unpickled and
no tensor is loaded.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from . import limits
from .layout import (
    CONSOLIDATED_DIR,
    CONSOLIDATED_SAFETENSORS_RE,
    DTYPE_BYTES,
    HF_METADATA_DIR,
    HF_METADATA_FILES,
    SAFETENSORS_INDEX,
    SAFETENSORS_METADATA_KEY,
    SAVED_OFFSETS_KEY,
    SHARDED_SAFETENSORS_RE,
    SHARDING_INFO_KEY,
)
from .limits import MAX_LISTED, MAX_METADATA_BYTES
from .metadata_shape import Budget, coverage_problem, is_dims
from .reading import CheckpointReader
from .values import clip, one_line

# The header's length field (safetensors' format).
HEADER_LENGTH_BYTES = 8
Chunk = tuple[tuple[int, ...], tuple[int, ...]]


class SafetensorsChecks(CheckpointReader):
    """The safetensors half of the validator (mixed into :class:`~remote.validator.Validator`)."""

    def check_safetensors(self, directory: Path, ranks: int | None, consolidated: bool) -> None:
        """policy/weights/model: one sharded file per training rank whose pieces tile every tensor, and the HF
        metadata beside them (or, consolidated, the Hugging Face copy instead of it)."""
        if self.inside(directory) is None:
            return
        if not directory.is_dir():
            self.problem(
                "shards",
                directory,
                "policy/weights/model is missing: the v2 worker's Automodel Checkpointer writes the sharded "
                "safetensors there (model_save_format=safetensors)",
            )
            return
        files = self.sharded_files(directory, ranks)
        chunks: dict[str, list[Chunk]] = {}
        for path in files:
            header = self.safetensors_header("shards", path)
            if header is not None:
                for fqn, chunk in self.sharded_pieces(path, header).items():
                    chunks.setdefault(fqn, []).append(chunk)
        self.check_tiling(directory, chunks)
        if consolidated:
            self.check_consolidated(directory / CONSOLIDATED_DIR)
        else:
            self.check_hf_metadata(directory / HF_METADATA_DIR)

    def sharded_files(self, directory: Path, ranks: int | None) -> list[Path]:
        """The shard-{i}-model-00001-of-00001.safetensors files, checked against the training ranks."""
        found: dict[int, Path] = {}
        misnamed: list[tuple[Path, str]] = []
        for entry in self.list_dir("shards", directory) or ():
            if not entry.name.endswith(".safetensors"):
                continue
            match = SHARDED_SAFETENSORS_RE.fullmatch(entry.name)
            if match and match.group(2) == match.group(3) == "00001" and int(match.group(1)) >= 1:
                found[int(match.group(1))] = entry
            else:
                misnamed.append(
                    (entry, "unexpected file name: a sharded save writes shard-{rank+1:05d}-model-00001-of-00001")
                )
        self.capped_each("shards", directory, misnamed, len(misnamed), "unexpected safetensors file names")
        sizes = {path: self.size_of(path) for path in found.values()}
        self.report.shards["weights"] = len(found)
        self.report.shard_bytes["weights"] = sum(size or 0 for size in sizes.values())
        count = ranks if ranks is not None else (max(found) if found else 0)
        if ranks is not None and len(found) != ranks:
            self.problem(
                "shards",
                directory,
                f"policy/weights/model holds {len(found)} sharded safetensors file(s), expected {ranks} (one per "
                f"training rank, training_ranks={ranks})",
            )
        elif not found:
            self.problem("shards", directory, "policy/weights/model holds no shard-*-model-*.safetensors file")
        missing = [
            (directory / f"shard-{i:05d}-model-00001-of-00001.safetensors", f"missing shard of rank {i - 1}")
            for i in range(1, count + 1)
            if i not in found
        ]
        self.capped_each("shards", directory, missing[:MAX_LISTED], len(missing), "missing shards")
        empty = [(path, "shard is empty (0 bytes)") for path, size in sizes.items() if size == 0]
        self.capped_each("shards", directory, empty, len(empty), "empty shards")
        return [found[i] for i in sorted(found)]

    def safetensors_header(self, check: str, path: Path) -> dict[str, Any] | None:
        """The parsed header of one safetensors file, its data offsets checked against the file's size; None after
        recording why not."""
        handle = self.open_file(check, path, "a safetensors file", limits.MAX_SAFETENSORS_BYTES)
        if handle is None:
            return None
        with handle:
            size = self.size_of(path) or 0
            head = handle.read(HEADER_LENGTH_BYTES)
            if len(head) < HEADER_LENGTH_BYTES:
                self.problem(check, path, f"{path.name} is {len(head)} bytes: too short for a safetensors header")
                return None
            (length,) = struct.unpack("<Q", head)
            if length > MAX_METADATA_BYTES or HEADER_LENGTH_BYTES + length > size:
                self.problem(
                    check,
                    path,
                    f"{path.name}'s header says it is {length:,} bytes, past the file ({size:,} bytes) or the "
                    f"validator's limit of {MAX_METADATA_BYTES:,}: truncated or not safetensors",
                )
                return None
            raw = handle.read(length)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            self.problem(check, path, f"{path.name}'s header is not JSON: {one_line(exc)}")
            return None
        if not isinstance(header, dict):
            self.problem(check, path, f"{path.name}'s header is a {type(header).__name__}, not an object")
            return None
        data_size = size - HEADER_LENGTH_BYTES - length
        bad = []
        for fqn, entry in header.items():
            if fqn == SAFETENSORS_METADATA_KEY:
                continue
            reason = _entry_problem(entry, data_size)
            if reason:
                bad.append(f"tensor {clip(fqn)}: {reason}")
        if bad:
            self.capped(check, path, bad, "tensors whose header entries do not fit the file")
            return None
        return header

    def sharded_pieces(self, path: Path, header: dict[str, Any]) -> dict[str, Chunk]:
        """Each tensor's piece in one sharded file: (offsets in the full tensor, shape)."""
        metadata = header.get(SAFETENSORS_METADATA_KEY) or {}
        text = metadata.get(SHARDING_INFO_KEY) if isinstance(metadata, dict) else None
        try:
            info = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            info = None
        if not isinstance(info, dict):
            self.problem(
                "shards",
                path,
                f"{path.name} has no {SHARDING_INFO_KEY} in its __metadata__: not a sharded save, so nothing says "
                "where its tensors sit in the model",
            )
            return {}
        pieces: dict[str, Chunk] = {}
        unplaced = []
        for fqn, entry in header.items():
            if fqn == SAFETENSORS_METADATA_KEY:
                continue
            offsets = (info.get(fqn) or {}).get(SAVED_OFFSETS_KEY) if isinstance(info.get(fqn), dict) else None
            shape = tuple(entry["shape"])
            if not isinstance(offsets, list) or not is_dims(tuple(offsets)) or len(offsets) != len(shape):
                unplaced.append(f"tensor {clip(fqn)} has no valid saved_offsets in {SHARDING_INFO_KEY}")
                continue
            pieces[fqn] = (tuple(offsets), shape)
        self.capped("shards", path, unplaced, "tensors without their place in the model")
        return pieces

    def check_tiling(self, directory: Path, chunks: dict[str, list[Chunk]]) -> None:
        """Every tensor's pieces, across the rank files, tile it exactly (its size is what they span)."""
        reasons = []
        budget = Budget(limits.MAX_OVERLAP_CHECKS)
        for fqn, pieces in chunks.items():
            self.report.tensors += 1
            ndims = {len(offsets) for offsets, _ in pieces}
            if len(ndims) != 1:
                reasons.append(f"tensor {clip(fqn)}: its pieces have {sorted(ndims)} dimensions")
                continue
            size = tuple(max(o[d] + s[d] for o, s in pieces) for d in range(ndims.pop()))
            reason = coverage_problem(size, pieces, budget)
            if reason:
                reasons.append(f"tensor {clip(fqn)} of size {list(size)}: {reason}")
        self.capped("shards", directory, reasons, "tensors whose pieces do not tile them")
        if budget.exhausted:
            self.problem(
                "shards", directory, f"stopped checking pieces for overlaps after {limits.MAX_OVERLAP_CHECKS:,}"
            )

    def check_hf_metadata(self, directory: Path) -> None:
        """model/.hf_metadata: the HF config and the tensor-to-file map Automodel's addon writes on rank 0."""
        if self.inside(directory) is None:
            return
        if not directory.is_dir():
            self.problem(
                "hf_metadata",
                directory,
                "policy/weights/model/.hf_metadata is missing: Automodel's ConsolidatedHFAddon writes the model's "
                "config.json and fqn_to_file_index_mapping.json there before a safetensors save",
            )
            return
        for name in HF_METADATA_FILES:
            self.check_json_file("hf_metadata", directory / name, "Automodel's HF metadata")

    def check_consolidated(self, directory: Path) -> None:
        """model/consolidated: a Hugging Face model directory (config.json, the index, every file it names)."""
        if self.inside(directory) is None:
            return
        if not directory.is_dir():
            self.problem(
                "consolidated",
                directory,
                "policy/weights/model/consolidated is missing: save_consolidated=true writes the Hugging Face copy "
                "there",
            )
            return
        self.check_json_file("consolidated", directory / "config.json", "the model's Hugging Face config")
        index = self.check_json_file("consolidated", directory / SAFETENSORS_INDEX, "the safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if index is not None and not isinstance(weight_map, dict):
            self.problem("consolidated", directory / SAFETENSORS_INDEX, "the index has no weight_map object")
            return
        named = sorted({str(v) for v in (weight_map or {}).values()})
        for name in named:
            path = directory / name
            if not CONSOLIDATED_SAFETENSORS_RE.fullmatch(Path(name).name) or Path(name).name != name:
                self.problem("consolidated", path, f"the index names {clip(name)}, not a model-*-of-*.safetensors")
                continue
            header = self.safetensors_header("consolidated", path)
            if header is None:
                continue
            absent = [fqn for fqn, file in weight_map.items() if file == name and fqn not in header]
            self.capped(
                "consolidated", path, [f"{clip(f)} is not in it" for f in absent], "tensors the index puts there"
            )
        if (directory.parent / HF_METADATA_DIR).exists():
            self.problem(
                "consolidated",
                directory.parent / HF_METADATA_DIR,
                "model/.hf_metadata is still there: Automodel moves it into consolidated/ once the consolidation "
                "finished, so it did not finish",
            )

    def check_json_file(self, check: str, path: Path, what: str) -> Any | None:
        """A small JSON file that must parse; its value, or None after recording why not."""
        text = self.read_text(check, path, what, limits.MAX_TOKENIZER_CONFIG_BYTES)
        if text is None:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            self.problem(check, path, f"{path.name} is not valid JSON: {one_line(exc)}")
            return None


def _entry_problem(entry: Any, data_size: int) -> str | None:
    """Why a tensor's header entry does not describe bytes inside the file, or None when it does."""
    if not isinstance(entry, dict):
        return "its entry is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not is_dims(tuple(shape)) or any(d < 0 for d in shape):
        return f"shape {clip(repr(shape))} is not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and is_dims(tuple(offsets))):
        return f"data_offsets {clip(repr(offsets))} is not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"its bytes [{begin}, {end}) lie outside the file's {data_size:,} data bytes (truncated?)"
    width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
    if width is None:
        return f"dtype {clip(repr(dtype))} is not a safetensors dtype"
    if end - begin != math.prod(shape) * width:
        return f"{end - begin} bytes for {shape} {dtype} ({math.prod(shape) * width} expected)"
    return None
