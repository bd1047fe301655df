"""Validate a NeMo RL GRPO checkpoint before it is exported and Lustre is deleted.

A NeMo RL run writes ``checkpoint_dir/tmp_step_N/`` and renames it to ``step_N/`` once everything is saved
(``nemo_rl/utils/checkpoint.py``)::

    step_N/config.yaml                  the run's master config (yaml.safe_dump)
    step_N/training_info.json           consumed_samples, current_step, current_epoch, total_steps, ...
    step_N/train_dataloader.pt          the dataloader state (torch.save)
    step_N/policy/weights/              torch.distributed.checkpoint: .metadata + __{rank}_0.distcp per rank
    step_N/policy/optimizer/            the same, for the optimizer state
    step_N/policy/tokenizer/            tokenizer.save_pretrained()

This file is deliberately self-contained (stdlib, PyYAML and, lazily, torch): it is shipped to the Ray cluster
as the job's working_dir and run there as ``python checkpoints.py validate DIR --expect '{json}'``. It prints
one ``CHECKPOINT_REPORT_JSON: {...}`` line (found in the job log with :func:`find_report`) and exits 0 when the
checkpoint is valid, 1 when it is not and 2 on a usage error. Locally: ``python -m nemo_rl_gke.checkpoints
validate DIR --expect-file expect.json --format text``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

MARKER = "CHECKPOINT_REPORT_JSON: "
# GRPOSaveState in nemo_rl/algorithms/grpo.py (v0.4.0 to v0.7.0); the metric and val_reward are optional.
TRAINING_INFO_KEYS = ("consumed_samples", "current_step", "current_epoch", "total_steps", "total_valid_tokens")
DCP_PARTS = ("weights", "optimizer")
# save_pretrained writes tokenizer_config.json plus at least one of these, depending on the tokenizer type.
VOCAB_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# One broken shard can make thousands of entries wrong; past this many, a check's problems are summarised.
MAX_LISTED = 10

_STEP_RE = re.compile(r"(?:(tmp|old)_)?step_(\d+)")
_SHARD_RE = re.compile(r"__(\d+)_(\d+)\.distcp")
_EXPECT_KEYS = ("step", "training_ranks", "config")


class ExpectationError(ValueError):
    """The expectation (what the submitted run should have produced) is malformed."""


@dataclass(frozen=True)
class Expectation:
    """What the submitted run should have produced; every field is optional.

    ``step`` is the final step (default: the highest ``step_N``), ``training_ranks`` the number of policy
    training ranks, i.e. DCP shards per directory (default: not checked, but shards must be ranks 0..n-1), and
    ``config`` maps dotted config.yaml keys to values, e.g. ``{"policy.model_name": "google/gemma-3-27b-it",
    "grpo.max_num_steps": 20, "policy.dtensor_cfg.tensor_parallel_size": 4, "cluster.num_nodes": 2,
    "cluster.gpus_per_node": 8, "policy.generation.colocated.enabled": true}``.
    """

    step: int | None = None
    training_ranks: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, minimum in (("step", 0), ("training_ranks", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
                raise ExpectationError(f"{name} must be an integer >= {minimum}, not {value!r}")
        if not isinstance(self.config, Mapping) or not all(isinstance(k, str) and k for k in self.config):
            raise ExpectationError(f"config must map dotted config.yaml keys to values, not {self.config!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Expectation | None) -> Expectation:
        """Build from JSON: known keys plus any top-level dotted key, which is taken as a config key."""
        if isinstance(data, Expectation):
            return data
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ExpectationError(f"the expectation must be a JSON object, not {type(data).__name__}")
        config = dict(data.get("config") or {})
        unknown = []
        for key, value in data.items():
            if key in _EXPECT_KEYS:
                continue
            if "." in key:
                config[key] = value
            else:
                unknown.append(key)
        if unknown:
            # A typo such as "training_rank" must not silently skip a check.
            raise ExpectationError(
                f"unknown expectation key(s) {', '.join(sorted(unknown))}: use {', '.join(_EXPECT_KEYS)} "
                "or dotted config.yaml keys such as policy.model_name"
            )
        return cls(step=data.get("step"), training_ranks=data.get("training_ranks"), config=config)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, recorded in the report."""
        return {"step": self.step, "training_ranks": self.training_ranks, "config": dict(self.config)}


@dataclass(frozen=True)
class Problem:
    """One failed check: which check, which file (relative to the checkpoint dir) and why, in words."""

    check: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.path}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        """JSON-friendly form."""
        return asdict(self)


@dataclass(frozen=True)
class FileRecord:
    """Size and sha256 of one small file, so the exported copy can be compared with what was validated."""

    path: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return asdict(self)


@dataclass
class Report:
    """The outcome of :func:`validate_checkpoint`; valid when it has no problems."""

    checkpoint_dir: str
    expect: Expectation
    step: int | None = None
    path: str | None = None
    problems: list[Problem] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DCP_PARTS, 0))
    shard_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DCP_PARTS, 0))
    files: list[FileRecord] = field(default_factory=list)
    tensors: int = 0
    training_info: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        """Whether every check passed."""
        return not self.problems

    @property
    def total_bytes(self) -> int:
        """Bytes in all weight and optimizer shards."""
        return sum(self.shard_bytes.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form: the line printed after :data:`MARKER`."""
        return {
            "valid": self.valid,
            "checkpoint_dir": self.checkpoint_dir,
            "step": self.step,
            "path": self.path,
            "problems": [p.to_dict() for p in self.problems],
            "shards": dict(self.shards),
            "shard_bytes": dict(self.shard_bytes),
            "files": [f.to_dict() for f in self.files],
            "tensors": self.tensors,
            "total_bytes": self.total_bytes,
            "training_info": self.training_info,
            "expect": self.expect.to_dict(),
        }

    def to_text(self) -> str:
        """Human-readable form, for ``--format text``."""
        where = self.path or self.checkpoint_dir
        if self.valid:
            lines = [f"OK: checkpoint {where} is valid"]
        else:
            lines = [f"INVALID: checkpoint {where} has {len(self.problems)} problem(s):"]
            lines += [f"  {i}. {problem}" for i, problem in enumerate(self.problems, 1)]
        shards = ", ".join(f"{part} {self.shards[part]}" for part in DCP_PARTS)
        lines.append(f"step {self.step}; shards: {shards}; {self.tensors} tensors; {self.total_bytes} shard bytes")
        lines += [f"  {f.sha256}  {f.size:>12}  {f.path}" for f in self.files]
        return "\n".join(lines)


def validate_checkpoint(checkpoint_dir: str | Path, expect: Expectation | Mapping[str, Any] | None = None) -> Report:
    """Check one NeMo RL checkpoint directory (the parent of ``step_N``) against what the run should have made.

    Never raises for a broken checkpoint: every failure is a :class:`Problem` in the report. Raises
    :class:`ExpectationError` only when ``expect`` itself is malformed.
    """
    return _Validator(Path(checkpoint_dir).absolute(), Expectation.from_dict(expect)).run()


def find_report(log_text: str) -> dict[str, Any] | None:
    """The last report printed in a log (e.g. the Ray job's), or None when there is none."""
    for line in reversed(log_text.splitlines()):
        at = line.find(MARKER)
        if at >= 0:
            try:
                return json.loads(line[at + len(MARKER) :])
            except ValueError:
                continue  # a line cut by log truncation; an earlier one may be whole
    return None


class _Validator:
    """Runs the checks in order and collects problems; one instance per validation."""

    def __init__(self, root: Path, expect: Expectation) -> None:
        self.root = root
        self.expect = expect
        self.report = Report(checkpoint_dir=str(root), expect=expect)
        self.config: dict[str, Any] | None = None

    def problem(self, check: str, path: Path | str, reason: str) -> None:
        """Record a problem; paths are shown relative to the checkpoint directory."""
        shown = path.relative_to(self.root).as_posix() if isinstance(path, Path) else path
        self.report.problems.append(Problem(check, shown or ".", reason))

    def capped(self, check: str, path: Path, reasons: list[str], what: str) -> None:
        """Record up to MAX_LISTED problems of one kind, then one summarising the rest."""
        for reason in reasons[:MAX_LISTED]:
            self.problem(check, path, reason)
        if len(reasons) > MAX_LISTED:
            self.problem(check, path, f"and {len(reasons) - MAX_LISTED} more {what}")

    def run(self) -> Report:
        """Run every check that the layout allows and return the report."""
        step_dir = self.select_step()
        if step_dir is None:
            return self.report
        self.report.path = str(step_dir)
        self.check_config(step_dir / "config.yaml")
        self.check_training_info(step_dir / "training_info.json")
        for part in DCP_PARTS:
            self.check_dcp(part, step_dir / "policy" / part)
        self.check_tokenizer(step_dir / "policy" / "tokenizer")
        self.check_nonempty_file("dataloader", step_dir / "train_dataloader.pt", "torch.save(dataloader.state_dict())")
        self.record_files(step_dir)
        return self.report

    # --- step directory -------------------------------------------------------------------------------------

    def select_step(self) -> Path | None:
        """Pick step_N (expected or highest) and reject unfinished saves (tmp_step_*, old_step_*)."""
        if not self.root.is_dir():
            self.problem("step", "", f"checkpoint directory {self.root} does not exist or is not a directory")
            return None
        found: dict[str | None, list[int]] = {None: [], "tmp": [], "old": []}
        for entry in self.root.iterdir():
            match = _STEP_RE.fullmatch(entry.name)
            if match and entry.is_dir():
                found[match.group(1)].append(int(match.group(2)))
        steps, tmps, olds = (sorted(found[kind]) for kind in (None, "tmp", "old"))
        expected = self.expect.step
        final = expected if expected is not None else (steps[-1] if steps else None)

        for n in tmps:
            if n not in steps and (n == final or not steps):
                reason = (
                    f"the save of step {n} did not finish: tmp_step_{n} was never renamed to step_{n} "
                    "(NeMo RL renames it only after the weights, optimizer, tokenizer and dataloader are written)"
                )
            else:
                reason = (
                    f"leftover tmp_step_{n}: a save of step {n} started but did not finish, so the run did not "
                    "end cleanly"
                )
            self.problem("step", self.root / f"tmp_step_{n}", reason)
        for n in olds:
            self.problem(
                "step",
                self.root / f"old_step_{n}",
                f"leftover old_step_{n}: finalize_checkpoint was interrupted while replacing step_{n}",
            )

        listing = ", ".join(f"step_{n}" for n in steps) or "no step_* directory"
        if final is None:
            hint = ""
            if _STEP_RE.fullmatch(self.root.name) and (self.root / "training_info.json").exists():
                hint = f"; {self.root.name} looks like a step directory itself: pass its parent"
            if not tmps:
                self.problem("step", "", f"no step_N directory in {self.root}{hint}")
            return None
        if final not in steps:
            if final not in tmps:
                self.problem("step", f"step_{final}", f"expected final step_{final}, found {listing}")
            return None
        self.report.step = final
        newer = [n for n in steps if n > final]
        if newer:
            self.problem(
                "step",
                f"step_{newer[-1]}",
                f"step_{newer[-1]} is newer than the expected final step_{final}: the directory holds another "
                "run's checkpoints, and NeMo RL would have resumed from the newest",
            )
        return self.root / f"step_{final}"

    # --- config.yaml and training_info.json -----------------------------------------------------------------

    def check_config(self, path: Path) -> None:
        """config.yaml parses and has the expected values at the expected dotted keys."""
        text = self.read_text("config", path, "the run's master config")
        if text is None:
            return
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            self.problem("config", path, f"config.yaml does not parse as YAML: {_one_line(exc)}")
            return
        if not isinstance(config, dict):
            self.problem("config", path, f"config.yaml holds a {type(config).__name__}, not a mapping")
            return
        self.config = config
        for key, want in self.expect.config.items():
            have = _lookup(config, key)
            if have is _MISSING:
                self.problem("config", path, f"{key} is missing from config.yaml; expected {json.dumps(want)}")
            elif not _same(have, want):
                self.problem(
                    "config",
                    path,
                    f"{key} is {json.dumps(have, default=str)} in config.yaml, but the run was submitted with "
                    f"{json.dumps(want, default=str)}",
                )

    def check_training_info(self, path: Path) -> None:
        """training_info.json parses, has GRPOSaveState's keys and its step counter equals N."""
        text = self.read_text("training_info", path, "GRPO's save state")
        if text is None:
            return
        try:
            info = json.loads(text)
        except ValueError as exc:
            self.problem("training_info", path, f"training_info.json is not valid JSON: {exc}")
            return
        if not isinstance(info, dict):
            self.problem("training_info", path, f"training_info.json holds a {type(info).__name__}, not an object")
            return
        self.report.training_info = info
        missing = [key for key in TRAINING_INFO_KEYS if key not in info]
        if missing:
            self.problem(
                "training_info",
                path,
                f"training_info.json lacks {', '.join(missing)} (GRPOSaveState has {', '.join(TRAINING_INFO_KEYS)})",
            )
        # Sync GRPO names the dir after total_steps + 1 and stores it as total_steps (current_step restarts each
        # epoch); async GRPO only updates current_step, which is its global step there.
        async_grpo = _lookup(self.config or {}, "grpo.async_grpo.enabled") is True
        key = "current_step" if async_grpo else "total_steps"
        step = self.report.step
        if key in info and (isinstance(info[key], bool) or info[key] != step):
            why = "async GRPO's step counter" if async_grpo else "GRPO's step counter across epochs"
            self.problem(
                "training_info",
                path,
                f"training_info.json {key} is {json.dumps(info[key])}, expected {step} for step_{step} "
                f"({key} is {why}, which names the directory)",
            )

    # --- torch.distributed.checkpoint directories -----------------------------------------------------------

    def check_dcp(self, part: str, directory: Path) -> None:
        """Shard files (one per training rank, none empty), .metadata readable, chunks and storage consistent."""
        if not directory.is_dir():
            self.problem(
                "shards", directory, f"policy/{part} is missing: NeMo RL writes the {part} there with dcp.save"
            )
            return
        sizes = self.check_shard_files(part, directory)
        metadata = self.read_metadata(part, directory)
        if metadata is None:
            return
        self.check_chunks(directory, metadata)
        self.check_storage(directory, metadata, sizes)

    def check_shard_files(self, part: str, directory: Path) -> dict[str, int]:
        """Count the __{rank}_0.distcp files against the training ranks; returns every .distcp file's size."""
        sizes: dict[str, int] = {}
        ranks: list[int] = []
        for entry in sorted(directory.iterdir()):
            if not entry.name.endswith(".distcp"):
                continue
            sizes[entry.name] = entry.stat().st_size
            match = _SHARD_RE.fullmatch(entry.name)
            if match and match.group(2) == "0":
                ranks.append(int(match.group(1)))
            else:
                self.problem(
                    "shards",
                    entry,
                    f"unexpected shard file name {entry.name}: NeMo RL's dcp.save writes one __{{rank}}_0.distcp "
                    "per rank",
                )
        self.report.shards[part] = len(ranks)
        self.report.shard_bytes[part] = sum(sizes.values())
        want = self.expect.training_ranks
        expected_ranks = range(want if want is not None else (max(ranks) + 1 if ranks else 0))
        if want is not None and len(ranks) != want:
            self.problem(
                "shards",
                directory,
                f"policy/{part} holds {len(ranks)} shard(s), expected {want} (one __{{rank}}_0.distcp per training "
                f"rank, training_ranks={want})",
            )
        elif not ranks:
            self.problem("shards", directory, f"policy/{part} holds no __{{rank}}_0.distcp shard")
        for rank in expected_ranks:
            if rank not in ranks:
                self.problem("shards", directory / f"__{rank}_0.distcp", f"missing shard of rank {rank}")
        for rank in ranks:
            if rank not in expected_ranks:
                self.problem(
                    "shards",
                    directory / f"__{rank}_0.distcp",
                    f"unexpected shard of rank {rank}: the run has {len(expected_ranks)} training rank(s)",
                )
        for name, size in sizes.items():
            if size == 0:
                self.problem("shards", directory / name, "shard is empty (0 bytes)")
        return sizes

    def read_metadata(self, part: str, directory: Path) -> Any | None:
        """Read .metadata the way DCP does; a missing, truncated or foreign file is a problem, not a traceback."""
        path = directory / ".metadata"
        if not path.is_file():
            if (directory / ".metadata.tmp").exists():
                reason = "missing .metadata: .metadata.tmp was never renamed, so dcp.save did not finish"
            else:
                reason = (
                    "missing .metadata: dcp.save writes it last, after every rank's shard, so the save did not finish"
                )
            if any(directory.rglob("*.safetensors")):
                reason += (
                    "; this directory holds safetensors (the DTensor v2 worker's model_save_format=safetensors), "
                    "a layout this validator does not check"
                )
            self.problem("metadata", path, reason)
            return None
        try:
            from torch.distributed.checkpoint import FileSystemReader
        except ImportError as exc:
            self.problem(
                "metadata", path, f"cannot read .metadata: torch.distributed.checkpoint is unavailable ({exc})"
            )
            return None
        try:
            metadata = FileSystemReader(str(directory)).read_metadata()
        except Exception as exc:  # unpickling garbage can raise nearly anything
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata ({path.stat().st_size} bytes) is unreadable, truncated or not a DCP "
                f"metadata file: {type(exc).__name__}: {_one_line(exc)}",
            )
            return None
        if not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata holds a {type(metadata).__name__}, not a DCP Metadata",
            )
            return None
        return metadata

    def check_chunks(self, directory: Path, metadata: Any) -> None:
        """Every tensor's chunks lie inside it, do not overlap and together cover it exactly."""
        reasons = []
        for fqn, item in metadata.state_dict_metadata.items():
            if not hasattr(item, "chunks"):
                continue  # BytesStorageMetadata: a pickled object, no chunks to cover
            self.report.tensors += 1
            reason = _coverage_problem(tuple(item.size), [(tuple(c.offsets), tuple(c.sizes)) for c in item.chunks])
            if reason:
                reasons.append(f"tensor {fqn} of size {list(item.size)}: {reason}")
        self.capped("metadata", directory / ".metadata", reasons, "tensors whose chunks do not cover them")

    def check_storage(self, directory: Path, metadata: Any, sizes: dict[str, int]) -> None:
        """Every storage entry points into an existing shard, inside its size; every chunk has an entry."""
        meta_path = directory / ".metadata"
        storage = getattr(metadata, "storage_data", None)
        if not isinstance(storage, dict):
            self.problem(
                "storage", meta_path, f".metadata has no storage_data mapping (found {type(storage).__name__})"
            )
            return
        indexed: set[tuple[str, tuple[int, ...] | None]] = set()
        ends: dict[str, tuple[int, int]] = {}  # file -> (entries, furthest byte any entry needs)
        bad: list[str] = []
        for index, info in storage.items():
            offset = getattr(index, "offset", None)
            indexed.add((index.fqn, None if offset is None else tuple(offset)))
            name, start, length = info.relative_path, info.offset, info.length
            if Path(name).name != name or start < 0 or length < 0:
                bad.append(f"storage entry of {index.fqn} is malformed: {name!r} at {start} length {length}")
                continue
            count, end = ends.get(name, (0, 0))
            ends[name] = (count + 1, max(end, start + length))
        for name, (count, end) in sorted(ends.items()):
            if name not in sizes:
                exists = (directory / name).exists()
                what = "is not a .distcp shard" if exists else "does not exist"
                bad.append(f"{count} storage entries point at {name}, which {what}")
            elif sizes[name] < end:
                bad.append(
                    f"{name} is {sizes[name]} bytes but .metadata has entries up to byte {end}: the shard is "
                    "shorter than its storage entries (truncated)"
                )
        self.capped("storage", meta_path, bad, "bad storage entries")
        missing = []
        for fqn, item in metadata.state_dict_metadata.items():
            if not hasattr(item, "chunks"):
                if (fqn, None) not in indexed:
                    missing.append(f"no storage entry for {fqn}")
                continue
            missing += [
                f"no storage entry for {fqn} chunk at offsets {list(c.offsets)}"
                for c in item.chunks
                if (fqn, tuple(c.offsets)) not in indexed
            ]
        self.capped("storage", meta_path, missing, "chunks without a storage entry")

    # --- tokenizer, dataloader, file records ----------------------------------------------------------------

    def check_tokenizer(self, directory: Path) -> None:
        """policy/tokenizer holds a save_pretrained() output: tokenizer_config.json and a vocabulary file."""
        if not directory.is_dir():
            self.problem("tokenizer", directory, "policy/tokenizer is missing: NeMo RL saves it with save_pretrained")
            return
        names = sorted(p.name for p in directory.iterdir())
        if not names:
            self.problem("tokenizer", directory, "policy/tokenizer is empty")
            return
        config = directory / "tokenizer_config.json"
        if not config.is_file():
            self.problem("tokenizer", config, f"tokenizer_config.json is missing (found {', '.join(names)})")
        else:
            try:
                json.loads(config.read_text())
            except (OSError, ValueError) as exc:
                self.problem("tokenizer", config, f"tokenizer_config.json is not valid JSON: {_one_line(exc)}")
        if not any(name in names for name in VOCAB_FILES):
            self.problem(
                "tokenizer",
                directory,
                f"policy/tokenizer has no vocabulary file (one of {', '.join(VOCAB_FILES)}; found {', '.join(names)})",
            )
        for path in sorted(directory.rglob("*")):
            if path.is_file() and path.stat().st_size == 0:
                self.problem("tokenizer", path, "tokenizer file is empty (0 bytes)")

    def check_nonempty_file(self, check: str, path: Path, what: str) -> None:
        """A file that must exist and hold something."""
        if not path.is_file():
            self.problem(check, path, f"{path.name} is missing ({what})")
        elif path.stat().st_size == 0:
            self.problem(check, path, f"{path.name} is empty (0 bytes)")

    def read_text(self, check: str, path: Path, what: str) -> str | None:
        """A small text file's content, or None after recording why it could not be read."""
        try:
            return path.read_text()
        except FileNotFoundError:
            self.problem(check, path, f"{path.name} is missing ({what})")
        except (OSError, UnicodeDecodeError) as exc:
            self.problem(check, path, f"{path.name} cannot be read: {_one_line(exc)}")
        return None

    def record_files(self, step_dir: Path) -> None:
        """Size and sha256 of the small files; shards are only sized (they can be hundreds of GB)."""
        paths = [step_dir / name for name in ("config.yaml", "training_info.json", "train_dataloader.pt")]
        paths += [step_dir / "policy" / part / ".metadata" for part in DCP_PARTS]
        tokenizer = step_dir / "policy" / "tokenizer"
        if tokenizer.is_dir():
            paths += sorted(p for p in tokenizer.rglob("*") if p.is_file())
        for path in paths:
            if path.is_file():
                self.report.files.append(
                    FileRecord(path.relative_to(self.root).as_posix(), path.stat().st_size, _sha256(path))
                )


_MISSING = object()


def _lookup(config: Any, dotted: str) -> Any:
    """config["a"]["b"] for "a.b"; list items by index; _MISSING when any part is absent."""
    node = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _same(have: Any, want: Any) -> bool:
    """Equality without Python's True == 1, but with 20 == 20.0 (JSON and YAML type numbers differently)."""
    if isinstance(have, bool) or isinstance(want, bool):
        return type(have) is type(want) and have == want
    return have == want


def _coverage_problem(size: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> str | None:
    """Why the chunks do not tile a tensor of this size exactly, or None when they do."""
    ndim = len(size)
    for offsets, sizes in chunks:
        if len(offsets) != ndim or len(sizes) != ndim:
            return f"chunk at offsets {list(offsets)} has {len(sizes)} dimension(s), the tensor {ndim}"
        # An empty chunk (a rank with no rows of an unevenly sharded tensor) holds no data wherever it points.
        outside = math.prod(sizes) and any(o < 0 or o + s > d for o, s, d in zip(offsets, sizes, size, strict=True))
        if outside or any(s < 0 for s in sizes):
            return f"chunk at offsets {list(offsets)} of sizes {list(sizes)} is out of bounds"
    # Sorted by offset, a chunk can only overlap the chunks after it that start before it ends in dimension 0.
    boxes = sorted((o, s) for o, s in chunks if math.prod(s) > 0)
    for i, (oa, sa) in enumerate(boxes):
        for ob, sb in boxes[i + 1 :]:
            if ndim and ob[0] >= oa[0] + sa[0]:
                break
            if all(ob[d] < oa[d] + sa[d] and oa[d] < ob[d] + sb[d] for d in range(ndim)):
                return f"chunks at offsets {list(oa)} and {list(ob)} overlap"
    covered, volume = sum(math.prod(s) for _, s in chunks), math.prod(size)
    if covered != volume:
        return f"its chunks cover {covered} of its {volume} elements"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _load_expectation(args: argparse.Namespace) -> Expectation:
    if args.expect_file is not None:
        text = sys.stdin.read() if args.expect_file == "-" else Path(args.expect_file).read_text()
    else:
        text = args.expect or "{}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ExpectationError(f"the expectation is not valid JSON: {exc}") from exc
    return Expectation.from_dict(data)


def main(argv: Iterable[str] | None = None) -> int:
    """Command line entry point; returns 0 (valid), 1 (invalid) or 2 (usage error)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate checkpoint_dir/step_N against an expectation")
    validate.add_argument("checkpoint_dir", help="the run's checkpointing.checkpoint_dir (parent of step_N)")
    source = validate.add_mutually_exclusive_group()
    source.add_argument("--expect", help='expectation as JSON, e.g. \'{"step": 20, "training_ranks": 16}\'')
    source.add_argument("--expect-file", help="file holding the expectation JSON ('-' for stdin)")
    validate.add_argument(
        "--format", choices=("json", "text"), default="json", help="json: one marker line (default); text: for people"
    )
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        report = validate_checkpoint(args.checkpoint_dir, _load_expectation(args))
    except (ExpectationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "text":
        print(report.to_text())
    else:
        # The human summary goes to stderr so stdout stays one machine-readable line; Ray's job log keeps both.
        print(report.to_text(), file=sys.stderr)
        print(MARKER + json.dumps(report.to_dict(), sort_keys=True, default=str), flush=True)
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
