"""Validate a NeMo RL GRPO checkpoint before it is exported and Lustre is deleted.

A NeMo RL run writes ``checkpoint_dir/tmp_step_N/`` and renames it to ``step_N/`` once everything is saved
(``nemo_rl/utils/checkpoint.py``)::

    step_N/config.yaml                  the run's master config (yaml.safe_dump)
    step_N/training_info.json           consumed_samples, current_step, current_epoch, total_steps, ...
    step_N/train_dataloader.pt          the dataloader state (torch.save)
    step_N/policy/weights/              torch.distributed.checkpoint: .metadata + __{rank}_0.distcp per rank
    step_N/policy/optimizer/            the same, for the optimizer state
    step_N/policy/tokenizer/            tokenizer.save_pretrained()

Every byte of a checkpoint is untrusted: whoever can trigger a run or write to its directory controls it. So the
validator never executes checkpoint content. ``.metadata`` (a pickle) is unpickled by :class:`DcpMetadataUnpickler`,
which resolves only the DCP metadata classes in :data:`DCP_PICKLE_GLOBALS` and refuses anything else unimported;
``config.yaml`` is parsed as plain YAML with a bound on alias expansion; every read is bounded by a size limit;
nothing is read through a symbolic link that leaves the checkpoint directory; and the shards and
``train_dataloader.pt`` (``torch.load`` pickles) are only sized and hashed, never loaded.

This file is deliberately self-contained (stdlib, PyYAML and, lazily, torch): it is shipped to the Ray cluster
as the job's working_dir and run there as ``python checkpoints.py validate DIR --expect '{json}'``. It prints
one ``CHECKPOINT_REPORT_JSON: {...}`` line (found in the job log with :func:`find_report`) and exits 0 when the
checkpoint is valid, 1 when it is not and 2 on a usage error. Locally: ``python -m nemo_rl_gke.checkpoints
validate DIR --expect-file expect.json --format text``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import math
import os
import pickle
import pickletools
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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

# The only globals a DCP .metadata pickle may name, as (module, name). Recorded with a find_class hook on torch
# 2.13 dcp.save outputs (bf16/fp32/fp16/int64/bool tensors, AdamW state, Python values, FSDP2 DTensor saves under
# gloo with 1 and 4 ranks; FACTS §17). Every torch dtype is allowed too (see _dcp_globals). Constructing any of
# these runs no code that touches anything outside the object.
DCP_PICKLE_GLOBALS = (
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
)
# Python 3.13 pickles PosixPath as pathlib._local.PosixPath (CPython gh-133789); read it as pathlib.PosixPath.
_GLOBAL_ALIASES = {("pathlib._local", "PosixPath"): ("pathlib", "PosixPath")}
# Pickle opcodes a DCP .metadata never holds, refused before unpickling: they reach outside the pickle.
REFUSED_OPCODES = {
    "PERSID": "a persistent id (an object the loader is asked to fetch from elsewhere)",
    "BINPERSID": "a persistent id (an object the loader is asked to fetch from elsewhere)",
    "EXT1": "a copyreg extension code (a global named by number)",
    "EXT2": "a copyreg extension code (a global named by number)",
    "EXT4": "a copyreg extension code (a global named by number)",
    "NEXT_BUFFER": "an out-of-band buffer",
    "READONLY_BUFFER": "an out-of-band buffer",
}

# Read limits in bytes: far above what NeMo RL writes, low enough that a crafted file cannot exhaust the Ray head.
# .metadata: 3,000 tensors x 64 ranks (192k chunks) pickle to about 2.3 MB, and unpickled objects take ~14x that.
MAX_METADATA_BYTES = 64 << 20
# config.yaml: NeMo RL's master config is ~20 KB, and PyYAML's pure-Python parser manages ~200 KB/s.
MAX_CONFIG_BYTES = 1 << 20
# training_info.json: a handful of numbers.
MAX_TRAINING_INFO_BYTES = 1 << 20
# tokenizer_config.json: about 1.2 MB for gemma-3 (its added tokens are listed there).
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20
# Any other recorded file (gemma-3's tokenizer.json is about 33 MB): hashed in 1 MiB blocks up to this size.
MAX_HASHED_BYTES = 1 << 30
# Names read from one directory: a DCP directory holds one shard per training rank plus .metadata.
MAX_DIR_ENTRIES = 65_536
# Files and directories walked under policy/tokenizer (save_pretrained writes a handful).
MAX_WALKED = 10_000
# YAML nodes in config.yaml once every alias is expanded (the file limit allows ~500k without aliases).
MAX_YAML_NODES = 1_000_000
# Nesting of training_info.json: GRPOSaveState is flat; deeper JSON could not be re-serialised into the report.
MAX_JSON_DEPTH = 32
# Chunk pairs compared for overlap per DCP directory: a real save needs about (chunks x TP), a crafted one n².
MAX_OVERLAP_CHECKS = 20_000_000
# Dimensions and magnitudes torch tensors can have; anything else in .metadata is malformed.
MAX_TENSOR_DIMS = 64
MAX_INT64 = (1 << 63) - 1
# Characters of a value from the checkpoint echoed in a reason.
MAX_SHOWN = 200

_STEP_RE = re.compile(r"(?:(tmp|old)_)?step_(\d+)", re.ASCII)
_SHARD_RE = re.compile(r"__(\d+)_(\d+)\.distcp", re.ASCII)
_EXPECT_KEYS = ("step", "training_ranks", "config", "stopped")
# Every file is opened without following a symlink in its last component (directories are walked the same way) and
# without blocking on a FIFO; fstat then says whether it is a regular file.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BLOCK = 1 << 20


class ExpectationError(ValueError):
    """The expectation (what the submitted run should have produced) is malformed."""


@dataclass(frozen=True)
class Expectation:
    """What the submitted run should have produced; every field is optional.

    ``step`` is the final step (default: the highest ``step_N``), ``training_ranks`` the number of policy
    training ranks, i.e. DCP shards per directory (default: not checked, but shards must be ranks 0..n-1), and
    ``config`` maps dotted config.yaml keys to values, e.g. ``{"policy.model_name": "google/gemma-3-27b-it",
    "grpo.max_num_steps": 20, "policy.dtensor_cfg.tensor_parallel_size": 4, "cluster.num_nodes": 2,
    "cluster.gpus_per_node": 8, "policy.generation.colocated.enabled": true}``. ``stopped`` says the job was stopped
    on purpose once ``step`` was saved (it converged): a later save the stop cut short (``tmp_step_N``, N > step)
    is what the stop left behind, noted rather than a problem.
    """

    step: int | None = None
    training_ranks: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    stopped: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (("step", 0), ("training_ranks", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
                raise ExpectationError(f"{name} must be an integer >= {minimum}, not {value!r}")
        if not isinstance(self.config, Mapping) or not all(isinstance(k, str) and k for k in self.config):
            raise ExpectationError(f"config must map dotted config.yaml keys to values, not {self.config!r}")
        if not isinstance(self.stopped, bool) or (self.stopped and self.step is None):
            raise ExpectationError(f"stopped must be true or false, and true only with a step, not {self.stopped!r}")

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
        return cls(
            step=data.get("step"),
            training_ranks=data.get("training_ranks"),
            config=config,
            stopped=data.get("stopped", False),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, recorded in the report."""
        return {
            "step": self.step,
            "training_ranks": self.training_ranks,
            "config": dict(self.config),
            "stopped": self.stopped,
        }


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
    notes: list[str] = field(default_factory=list)
    steps_present: list[str] | None = None  # every step_N on the mount, when asked (--list-steps)

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
            "notes": list(self.notes),
            "expect": self.expect.to_dict(),
            **({"steps_present": list(self.steps_present)} if self.steps_present is not None else {}),
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
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def validate_checkpoint(checkpoint_dir: str | Path, expect: Expectation | Mapping[str, Any] | None = None) -> Report:
    """Check one NeMo RL checkpoint directory (the parent of ``step_N``) against what the run should have made.

    Never raises for a broken checkpoint: every failure is a :class:`Problem` in the report. Raises
    :class:`ExpectationError` only when ``expect`` itself is malformed.
    """
    return _Validator(Path(checkpoint_dir).absolute(), Expectation.from_dict(expect)).run()


# How deep and how many directories the step listing walks; past either it says so, and the listing keeps Lustre.
LIST_DEPTH = 8
LIST_LIMIT = 20_000
LIST_TRUNCATED = "<listing truncated>"
_STEP_DIR = re.compile(r"^step_[0-9]+$")


def list_step_dirs(mount: str | Path) -> list[str]:
    """Every ``step_N`` directory on a Lustre mount, as paths on the filesystem (``/dir/step_N``), sorted.

    Teardown compares them with the checkpoint records before it deletes the instance. A ``step_N`` directory is not
    entered, symbolic links are not followed; past :data:`LIST_DEPTH` levels or :data:`LIST_LIMIT` directories the
    list ends with :data:`LIST_TRUNCATED`, which no record accounts for (so Lustre is kept, not guessed about).
    """
    root = Path(mount)
    found: list[str] = []
    todo = [(root, 0)]
    seen = 0
    while todo:
        directory, depth = todo.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            seen += 1
            if seen > LIST_LIMIT:
                return [*sorted(found), LIST_TRUNCATED]
            path = "/" + Path(entry.path).relative_to(root).as_posix()
            if _STEP_DIR.match(entry.name):
                found.append(path)
            elif depth + 1 < LIST_DEPTH:
                todo.append((Path(entry.path), depth + 1))
            else:
                return [*sorted(found), LIST_TRUNCATED]
    return sorted(found)


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


class RefusedPickleError(pickle.UnpicklingError):
    """A .metadata pickle asked for a global or an opcode that DCP metadata never holds; nothing was imported."""


class YamlAliasError(yaml.YAMLError):
    """config.yaml's aliases expand it past MAX_YAML_NODES nodes, or an alias refers to a node that contains it."""


class DcpMetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` resolving only :data:`DCP_PICKLE_GLOBALS` and torch dtypes.

    ``allowed`` maps ``(module, name)`` to the objects, resolved beforehand from trusted modules: ``find_class``
    only looks names up there, so a name the pickle asks for is never imported. Use :func:`load_dcp_metadata`,
    which also refuses the opcodes in :data:`REFUSED_OPCODES` and checks every length before unpickling.
    """

    def __init__(self, file: BinaryIO, allowed: Mapping[tuple[str, str], Any]) -> None:
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        """The allowed object, or :class:`RefusedPickleError` naming what was asked for."""
        found = self._allowed.get((module, name))
        if found is None:
            raise RefusedPickleError(f"{_clip(module)}.{_clip(name)}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        """Persistent ids are refused (the pre-scan refuses them first; this is the backstop)."""
        raise RefusedPickleError(REFUSED_OPCODES["PERSID"])


def load_dcp_metadata(data: bytes) -> Any:
    """Unpickle DCP ``.metadata`` bytes with :class:`DcpMetadataUnpickler`; raises on anything but metadata.

    Raises :class:`RefusedPickleError` for a global outside the allowlist or a refused opcode, ImportError when
    torch.distributed.checkpoint is missing, and other exceptions for bytes that are not a whole pickle.
    """
    # pickletools reads every length-prefixed argument with a bounded read, so a crafted length (C pickle allocates
    # it before reading) fails here, and refused opcodes are named before any object exists.
    for opcode, _arg, pos in pickletools.genops(io.BytesIO(data)):
        if opcode.name in REFUSED_OPCODES:
            raise RefusedPickleError(f"{REFUSED_OPCODES[opcode.name]} (opcode {opcode.name} at byte {pos})")
    return DcpMetadataUnpickler(io.BytesIO(data), _dcp_globals()).load()


_DCP_GLOBALS: dict[tuple[str, str], Any] = {}


def _dcp_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for every allowed global; imports torch (trusted) on first use."""
    if not _DCP_GLOBALS:
        import torch

        found = {(module, name): getattr(importlib.import_module(module), name) for module, name in DCP_PICKLE_GLOBALS}
        found.update({alias: found[target] for alias, target in _GLOBAL_ALIASES.items()})
        # vars(), not getattr: torch's module __getattr__ would import submodules for unknown names.
        found.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
        _DCP_GLOBALS.update(found)
    return _DCP_GLOBALS


class _BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (plain data, no Python tags) that sizes each node as if its aliases were expanded.

    A billion-laughs file is a few hundred bytes of aliases to aliases: it is refused while it is composed, as soon
    as one node would expand past MAX_YAML_NODES, before anything walks (or prints) the expanded data.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose as PyYAML does, then record the node's expanded size (aliases count in full)."""
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # its anchor is still being composed: a node containing itself
                raise YamlAliasError("config.yaml has a recursive alias (a node that contains an alias to itself)")
            return node
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_YAML_NODES:
            raise YamlAliasError(
                f"config.yaml's aliases expand it past {MAX_YAML_NODES:,} nodes (a YAML alias bomb); "
                "yaml.safe_dump of a NeMo RL config comes nowhere near that"
            )
        self._sizes[id(node)] = size
        return node


class _Validator:
    """Runs the checks in order and collects problems; one instance per validation."""

    def __init__(self, root: Path, expect: Expectation) -> None:
        self.root = root
        self.expect = expect
        self.report = Report(checkpoint_dir=str(root), expect=expect)
        self.config: dict[str, Any] | None = None
        # Set in run(): the root with its own symlinks resolved (the caller's choice) and a descriptor on it, from
        # which every file is opened one component at a time.
        self.real_root = root
        self.root_fd = -1
        self.refused: set[Path] = set()  # symlinks already reported, so each is reported once
        self.oversized: set[Path] = set()  # files already reported as over their limit, so not hashed either

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

    def capped_each(self, check: str, where: Path, found: list[tuple[Path, str]], total: int, what: str) -> None:
        """Record up to MAX_LISTED (path, reason) problems, then one at where counting the rest of total."""
        for path, reason in found[:MAX_LISTED]:
            self.problem(check, path, reason)
        if total > MAX_LISTED:
            self.problem(check, where, f"and {total - MAX_LISTED} more {what}")

    def run(self) -> Report:
        """Run every check that the layout allows and return the report."""
        if not self.root.is_dir():
            self.problem("step", "", f"checkpoint directory {self.root} does not exist or is not a directory")
            return self.report
        try:
            self.real_root = self.root.resolve(strict=True)
            self.root_fd = os.open(self.real_root, _DIR_FLAGS)
        except (OSError, RuntimeError) as exc:
            self.problem("step", "", f"checkpoint directory {self.root} cannot be opened: {_one_line(exc)}")
            return self.report
        try:
            step_dir = self.select_step()
            if step_dir is None:
                return self.report
            self.report.path = str(step_dir)
            self.check_config(step_dir / "config.yaml")
            self.check_training_info(step_dir / "training_info.json")
            for part in DCP_PARTS:
                self.check_dcp(part, step_dir / "policy" / part)
            tokenizer_files = self.check_tokenizer(step_dir / "policy" / "tokenizer")
            self.check_nonempty_file(
                "dataloader", step_dir / "train_dataloader.pt", "torch.save(dataloader.state_dict())"
            )
            self.record_files(step_dir, tokenizer_files)
            return self.report
        finally:
            os.close(self.root_fd)

    # --- reaching files inside the checkpoint directory only ------------------------------------------------------

    def inside(self, path: Path) -> Path | None:
        """path with its symlinks resolved, or None (recorded) when a symlink on the way leaves the checkpoint dir.

        Symlinks that stay inside are followed: only where a path leads matters, and it must stay under the root.
        """
        here = self.root
        for part in path.relative_to(self.root).parts:
            here = here / part
            if not _is_symlink(here):
                continue
            try:
                target = here.resolve()
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
                self.refuse_link(here, "is a symbolic link that loops")
                return None
            if not target.is_relative_to(self.real_root):
                self.refuse_link(here, f"is a symbolic link to {_clip(str(target))}, outside the checkpoint directory")
                return None
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            self.refuse_link(path, "cannot be resolved (a symbolic link loop)")
            return None
        if not real.is_relative_to(self.real_root):  # a link swapped in since the walk above
            self.refuse_link(path, "leads outside the checkpoint directory through a symbolic link")
            return None
        return real

    def refuse_link(self, link: Path, reason: str) -> None:
        """Report a symlink once: nothing behind it is read, sized or hashed."""
        if link not in self.refused:
            self.refused.add(link)
            self.problem("symlink", link, f"{link.name} {reason}: refused, nothing is read through it")

    def open_inside(self, real: Path) -> int:
        """A descriptor on real (a resolved path under the root), opened component by component from the root.

        No component may be a symlink (O_NOFOLLOW), so a link swapped in after :meth:`inside` cannot lead out.
        """
        parts = real.relative_to(self.real_root).parts
        fd = os.open(".", _DIR_FLAGS, dir_fd=self.root_fd)
        try:
            for part in parts[:-1]:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
            return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd) if parts else os.dup(fd)
        finally:
            os.close(fd)

    def open_file(self, check: str, path: Path, what: str, limit: int) -> BinaryIO | None:
        """A regular file under the root, opened no larger than limit bytes; None after recording why not."""
        real = self.inside(path)
        if real is None:
            return None
        try:
            handle = open(self.open_inside(real), "rb")  # noqa: SIM115 (returned to the caller, who closes it)
        except FileNotFoundError:
            self.problem(check, path, f"{path.name} is missing ({what})")
            return None
        except OSError as exc:
            self.problem(check, path, f"{path.name} cannot be read: {_one_line(exc)}")
            return None
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            handle.close()
            self.problem(check, path, f"{path.name} is not a regular file ({what})")
            return None
        if info.st_size > limit:
            handle.close()
            self.oversized.add(path)
            self.problem(
                check,
                path,
                f"{path.name} is {info.st_size:,} bytes, over the validator's limit of {limit:,} bytes for {what}: "
                "not read",
            )
            return None
        return handle

    def read_bounded(self, check: str, path: Path, what: str, limit: int) -> bytes | None:
        """The whole content of a file of at most limit bytes, or None after recording why not."""
        handle = self.open_file(check, path, what, limit)
        if handle is None:
            return None
        with handle:
            data = handle.read(limit + 1)
        if len(data) > limit:  # it grew after fstat
            self.oversized.add(path)
            self.problem(check, path, f"{path.name} grew past the validator's limit of {limit:,} bytes for {what}")
            return None
        return data

    def read_text(self, check: str, path: Path, what: str, limit: int) -> str | None:
        """A small UTF-8 text file's content, or None after recording why it could not be read."""
        data = self.read_bounded(check, path, what, limit)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem(check, path, f"{path.name} cannot be read: {_one_line(exc)}")
            return None

    def list_dir(self, check: str, directory: Path) -> list[Path] | None:
        """The entries of a directory under the root (at most MAX_DIR_ENTRIES), sorted; None when unreadable."""
        real = self.inside(directory)
        if real is None:
            return None
        names: list[str] = []
        try:
            with os.scandir(real) as entries:
                for entry in entries:
                    if len(names) == MAX_DIR_ENTRIES:
                        self.problem(
                            check,
                            directory,
                            f"{directory.name} holds more than {MAX_DIR_ENTRIES:,} entries: not read further",
                        )
                        break
                    names.append(entry.name)
        except OSError as exc:
            self.problem(check, directory, f"{directory.name} cannot be listed: {_one_line(exc)}")
            return None
        return [directory / name for name in sorted(names)]

    def walk_files(self, check: str, top: Path) -> list[Path]:
        """Regular files under top (symlinks inside the root included, symlinked directories not descended)."""
        found: list[Path] = []
        pending = [top]
        walked = 0
        while pending:
            for path in self.list_dir(check, pending.pop()) or ():
                walked += 1
                if walked > MAX_WALKED:
                    self.problem(check, top, f"{top.name} holds more than {MAX_WALKED:,} files and directories")
                    return sorted(found)
                real = self.inside(path)
                if real is None:
                    continue
                if real.is_dir() and not _is_symlink(path):
                    pending.append(path)
                elif real.is_file():
                    found.append(path)
        return sorted(found)

    def size_of(self, path: Path) -> int | None:
        """A file's size when it is reached inside the root; None when refused or missing."""
        real = self.inside(path)
        if real is None:
            return None
        try:
            return real.stat().st_size
        except OSError:
            return None

    # --- step directory -------------------------------------------------------------------------------------

    def select_step(self) -> Path | None:
        """Pick step_N (expected or highest) and reject unfinished saves (tmp_step_*, old_step_*)."""
        found: dict[str | None, list[int]] = {None: [], "tmp": [], "old": []}
        for entry in self.list_dir("step", self.root) or ():
            match = _STEP_RE.fullmatch(entry.name)
            if match and self.inside(entry) is not None and entry.is_dir():
                found[match.group(1)].append(int(match.group(2)))
        steps, tmps, olds = (sorted(found[kind]) for kind in (None, "tmp", "old"))
        expected = self.expect.step
        final = expected if expected is not None else (steps[-1] if steps else None)

        for n in tmps:
            if self.expect.stopped and final is not None and n > final:
                self.report.notes.append(f"tmp_step_{n}: the save the stop after step {final} cut short")
                continue
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
            if _STEP_RE.fullmatch(self.root.name) and os.path.lexists(self.root / "training_info.json"):
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
        text = self.read_text("config", path, "the run's master config", MAX_CONFIG_BYTES)
        if text is None:
            return
        try:
            config = yaml.load(text, Loader=_BoundedSafeLoader)  # a SafeLoader subclass: plain data only
        except YamlAliasError as exc:
            self.problem("config", path, f"config.yaml is refused: {exc}")
            return
        except yaml.YAMLError as exc:
            self.problem("config", path, f"config.yaml does not parse as YAML: {_one_line(exc)}")
            return
        except RecursionError:
            self.problem("config", path, "config.yaml nests too deeply to parse")
            return
        except ValueError as exc:  # e.g. an integer past Python's int/str conversion limit
            self.problem("config", path, f"config.yaml holds a value Python cannot convert: {_one_line(exc)}")
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
                    f"{key} is {_show(have)} in config.yaml, but the run was submitted with "
                    f"{json.dumps(want, default=str)}",
                )

    def check_training_info(self, path: Path) -> None:
        """training_info.json parses, has GRPOSaveState's keys and its step counter equals N."""
        text = self.read_text("training_info", path, "GRPO's save state", MAX_TRAINING_INFO_BYTES)
        if text is None:
            return
        try:
            info = json.loads(text)
        except ValueError as exc:
            self.problem("training_info", path, f"training_info.json is not valid JSON: {_one_line(exc)}")
            return
        except RecursionError:
            info = None
        if info is None or _depth(info) > MAX_JSON_DEPTH:
            self.problem("training_info", path, f"training_info.json nests deeper than {MAX_JSON_DEPTH} levels")
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
                f"training_info.json {key} is {_show(info[key])}, expected {step} for step_{step} "
                f"({key} is {why}, which names the directory)",
            )

    # --- torch.distributed.checkpoint directories -----------------------------------------------------------

    def check_dcp(self, part: str, directory: Path) -> None:
        """Shard files (one per training rank, none empty), .metadata readable, chunks and storage consistent."""
        if self.inside(directory) is None:
            return
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
        misnamed: list[tuple[Path, str]] = []
        for entry in self.list_dir("shards", directory) or ():
            if not entry.name.endswith(".distcp"):
                continue
            size = self.size_of(entry)
            if size is None:
                continue
            sizes[entry.name] = size
            match = _SHARD_RE.fullmatch(entry.name)
            if match and match.group(2) == "0" and int(match.group(1)) >= MAX_DIR_ENTRIES:
                # No directory this validator reads holds that many shards; counting up to it would never end.
                misnamed.append(
                    (
                        entry,
                        f"shard {_clip(entry.name)} names a rank beyond the {MAX_DIR_ENTRIES:,} a DCP directory "
                        "can hold here",
                    )
                )
            elif match and match.group(2) == "0":
                ranks.append(int(match.group(1)))
            else:
                misnamed.append(
                    (
                        entry,
                        f"unexpected shard file name {_clip(entry.name)}: NeMo RL's dcp.save writes one "
                        "__{rank}_0.distcp per rank",
                    )
                )
        self.capped_each("shards", directory, misnamed, len(misnamed), "unexpected shard file names")
        self.report.shards[part] = len(ranks)
        self.report.shard_bytes[part] = sum(sizes.values())
        want = self.expect.training_ranks
        count = want if want is not None else (max(ranks) + 1 if ranks else 0)  # ranks 0..count-1 expected
        if want is not None and len(ranks) != want:
            self.problem(
                "shards",
                directory,
                f"policy/{part} holds {len(ranks)} shard(s), expected {want} (one __{{rank}}_0.distcp per training "
                f"rank, training_ranks={want})",
            )
        elif not ranks:
            self.problem("shards", directory, f"policy/{part} holds no __{{rank}}_0.distcp shard")
        present = set(ranks)
        missing_count = count - sum(1 for rank in present if rank < count)
        missing = []
        rank = 0
        while len(missing) < min(missing_count, MAX_LISTED):
            if rank not in present:
                missing.append((directory / f"__{rank}_0.distcp", f"missing shard of rank {rank}"))
            rank += 1
        self.capped_each("shards", directory, missing, missing_count, "missing shards")
        unexpected = [
            (directory / f"__{rank}_0.distcp", f"unexpected shard of rank {rank}: the run has {count} training rank(s)")
            for rank in ranks
            if rank >= count
        ]
        self.capped_each("shards", directory, unexpected, len(unexpected), "unexpected shards")
        empty = [(directory / name, "shard is empty (0 bytes)") for name, size in sizes.items() if size == 0]
        self.capped_each("shards", directory, empty, len(empty), "empty shards")
        return sizes

    def read_metadata(self, part: str, directory: Path) -> Any | None:
        """Unpickle .metadata with the DCP allowlist; a missing, oversized, refused or foreign file is a problem."""
        path = directory / ".metadata"
        if self.inside(path) is None:
            return None
        if not path.is_file():
            if os.path.lexists(directory / ".metadata.tmp"):
                reason = "missing .metadata: .metadata.tmp was never renamed, so dcp.save did not finish"
            else:
                reason = (
                    "missing .metadata: dcp.save writes it last, after every rank's shard, so the save did not finish"
                )
            if any(p.name.endswith(".safetensors") for p in self.walk_files("metadata", directory)):
                reason += (
                    "; this directory holds safetensors (the DTensor v2 worker's model_save_format=safetensors), "
                    "a layout this validator does not check"
                )
            self.problem("metadata", path, reason)
            return None
        data = self.read_bounded("metadata", path, "DCP metadata", MAX_METADATA_BYTES)
        if data is None:
            return None
        try:
            metadata = load_dcp_metadata(data)
        except ImportError as exc:
            self.problem(
                "metadata", path, f"cannot read .metadata: torch.distributed.checkpoint is unavailable ({exc})"
            )
            return None
        except RefusedPickleError as exc:
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata ({len(data)} bytes) is refused: its pickle asks for {exc}, which a DCP "
                "metadata file never holds; nothing was imported or run (a crafted .metadata runs code when "
                "unpickled)",
            )
            return None
        except Exception as exc:  # unpickling garbage can raise nearly anything
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata ({len(data)} bytes) is unreadable, truncated or not a DCP "
                f"metadata file: {type(exc).__name__}: {_one_line(exc)}",
            )
            return None
        classes = _dcp_globals()
        if type(metadata) is not classes[("torch.distributed.checkpoint.metadata", "Metadata")]:
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata holds a {type(metadata).__name__}, not a DCP Metadata",
            )
            return None
        malformed = _malformed(metadata, classes)
        if malformed:
            self.problem("metadata", path, f"policy/{part}/.metadata is not well-formed DCP metadata: {malformed}")
            return None
        return metadata

    def check_chunks(self, directory: Path, metadata: Any) -> None:
        """Every tensor's chunks lie inside it, do not overlap and together cover it exactly."""
        reasons = []
        budget = _Budget(MAX_OVERLAP_CHECKS)
        for fqn, item in metadata.state_dict_metadata.items():
            if not hasattr(item, "chunks"):
                continue  # BytesStorageMetadata: a pickled object, no chunks to cover
            self.report.tensors += 1
            chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in item.chunks]
            reason = _coverage_problem(tuple(item.size), chunks, budget)
            if reason:
                reasons.append(f"tensor {_clip(fqn)} of size {list(item.size)}: {reason}")
        self.capped("metadata", directory / ".metadata", reasons, "tensors whose chunks do not cover them")
        if budget.exhausted:
            self.problem(
                "metadata",
                directory / ".metadata",
                f"stopped checking chunks for overlaps after {MAX_OVERLAP_CHECKS:,} comparisons: no DCP save needs "
                "that many, so the chunks are laid out to make the check slow",
            )

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
            if Path(name).name != name or name in ("", ".", "..") or start < 0 or length < 0:
                bad.append(
                    f"storage entry of {_clip(index.fqn)} is malformed: {_clip(repr(name))} at {start} length {length}"
                )
                continue
            count, end = ends.get(name, (0, 0))
            ends[name] = (count + 1, max(end, start + length))
        for name, (count, end) in sorted(ends.items()):
            if name not in sizes:
                exists = os.path.lexists(directory / name)
                what = "is not a .distcp shard" if exists else "does not exist"
                bad.append(f"{count} storage entries point at {_clip(name)}, which {what}")
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
                    missing.append(f"no storage entry for {_clip(fqn)}")
                continue
            missing += [
                f"no storage entry for {_clip(fqn)} chunk at offsets {list(c.offsets)}"
                for c in item.chunks
                if (fqn, tuple(c.offsets)) not in indexed
            ]
        self.capped("storage", meta_path, missing, "chunks without a storage entry")

    # --- tokenizer, dataloader, file records ----------------------------------------------------------------

    def check_tokenizer(self, directory: Path) -> list[Path]:
        """policy/tokenizer holds a save_pretrained() output: tokenizer_config.json and a vocabulary file.

        Returns the tokenizer's files, for :meth:`record_files`.
        """
        if self.inside(directory) is None:
            return []
        if not directory.is_dir():
            self.problem("tokenizer", directory, "policy/tokenizer is missing: NeMo RL saves it with save_pretrained")
            return []
        names = [p.name for p in self.list_dir("tokenizer", directory) or ()]
        if not names:
            self.problem("tokenizer", directory, "policy/tokenizer is empty")
            return []
        shown = _clip(", ".join(names))
        config = directory / "tokenizer_config.json"
        if not os.path.lexists(config):
            self.problem("tokenizer", config, f"tokenizer_config.json is missing (found {shown})")
        else:
            text = self.read_text("tokenizer", config, "the tokenizer's config", MAX_TOKENIZER_CONFIG_BYTES)
            try:
                if text is not None:
                    json.loads(text)
            except (ValueError, RecursionError) as exc:
                self.problem("tokenizer", config, f"tokenizer_config.json is not valid JSON: {_one_line(exc)}")
        if not any(name in names for name in VOCAB_FILES):
            self.problem(
                "tokenizer",
                directory,
                f"policy/tokenizer has no vocabulary file (one of {', '.join(VOCAB_FILES)}; found {shown})",
            )
        files = self.walk_files("tokenizer", directory)
        for path in files:
            if self.size_of(path) == 0:
                self.problem("tokenizer", path, "tokenizer file is empty (0 bytes)")
        return files

    def check_nonempty_file(self, check: str, path: Path, what: str) -> None:
        """A file that must exist and hold something."""
        real = self.inside(path)
        if real is None:
            return
        if not real.is_file():
            self.problem(check, path, f"{path.name} is missing ({what})")
        elif real.stat().st_size == 0:
            self.problem(check, path, f"{path.name} is empty (0 bytes)")

    def record_files(self, step_dir: Path, tokenizer_files: list[Path]) -> None:
        """Size and sha256 of the small files; shards are only sized (they can be hundreds of GB)."""
        limits = {
            step_dir / "config.yaml": MAX_CONFIG_BYTES,
            step_dir / "training_info.json": MAX_TRAINING_INFO_BYTES,
            step_dir / "train_dataloader.pt": MAX_HASHED_BYTES,
        }
        limits.update({step_dir / "policy" / part / ".metadata": MAX_METADATA_BYTES for part in DCP_PARTS})
        limits.update({path: MAX_HASHED_BYTES for path in tokenizer_files})
        for path, limit in limits.items():
            # Missing, refused and oversized files were reported by their own check.
            real = None if path in self.oversized or not os.path.lexists(path) else self.inside(path)
            if real is None:
                continue
            try:
                handle = open(self.open_inside(real), "rb")  # noqa: SIM115 (closed by the with below)
            except OSError:
                continue
            with handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_size > limit:
                    self.problem(
                        "files", path, f"{path.name} is {info.st_size:,} bytes, over the {limit:,} bytes it may hash"
                    )
                    continue
                size, digest = _sha256(handle, limit)
            if size > limit:
                self.problem("files", path, f"{path.name} grew past {limit:,} bytes while it was hashed")
                continue
            self.report.files.append(FileRecord(path.relative_to(self.root).as_posix(), size, digest))


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


def _malformed(metadata: Any, classes: Mapping[tuple[str, str], Any]) -> str | None:
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
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            return f"a state_dict_metadata key is a {type(fqn).__name__}, not a string"
        if type(item) is bytes_cls:
            continue
        if type(item) is not tensor_cls:
            return f"{_clip(fqn)} is described by a {type(item).__name__}"
        chunks = getattr(item, "chunks", None)
        if not _is_dims(getattr(item, "size", None)) or not isinstance(chunks, list):
            return f"{_clip(fqn)} has no valid size or chunk list"
        for chunk in chunks:
            if type(chunk) is not chunk_cls or not (
                _is_dims(getattr(chunk, "offsets", None)) and _is_dims(getattr(chunk, "sizes", None))
            ):
                return f"{_clip(fqn)} has a chunk without valid offsets and sizes"
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return None  # check_storage says so, in the words it always has
    for index, info in storage.items():
        offset = getattr(index, "offset", None)
        if type(index) is not index_cls or not isinstance(getattr(index, "fqn", None), str):
            return f"a storage_data key is a {type(index).__name__} without a string fqn"
        if offset is not None and not _is_dims(offset):
            return f"the storage entry of {_clip(index.fqn)} has an invalid offset"
        fields = [getattr(info, name, None) for name in ("relative_path", "offset", "length")]
        if type(info) is not info_cls or not isinstance(fields[0], str) or not all(map(_is_int64, fields[1:])):
            return f"the storage entry of {_clip(index.fqn)} is not a file name, an offset and a length"
    return None


def _is_int64(value: Any) -> bool:
    return type(value) is int and -MAX_INT64 <= value <= MAX_INT64


def _is_dims(value: Any) -> bool:
    """A torch.Size-like tuple of int64s with no more dimensions than torch allows."""
    return isinstance(value, tuple) and len(value) <= MAX_TENSOR_DIMS and all(map(_is_int64, value))


class _Budget:
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


def _coverage_problem(
    size: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]], budget: _Budget
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


def _depth(value: Any) -> int:
    """How deeply JSON containers nest (a scalar is 0), counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                pending.extend((child, level + 1) for child in children)
    return deepest


def _is_symlink(path: Path) -> bool:
    try:
        return path.is_symlink()
    except OSError:
        return False


def _sha256(handle: BinaryIO, limit: int) -> tuple[int, str]:
    """(bytes read, sha256) of an open file, read in 1 MiB blocks and never past limit + 1 bytes."""
    digest = hashlib.sha256()
    size = 0
    while size <= limit:
        block = handle.read(min(_BLOCK, limit + 1 - size))
        if not block:
            break
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()


def _show(value: Any) -> str:
    """JSON for a value read from the checkpoint, cut to MAX_SHOWN characters; never raises."""
    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):  # an int past Python's str limit, a date key, deep nesting
        text = f"<a {type(value).__name__}>"
    return _clip(text)


def _clip(text: str) -> str:
    """A string from the checkpoint, cut to MAX_SHOWN characters so a crafted name cannot flood the report."""
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"


def _one_line(exc: BaseException) -> str:
    return _clip(" ".join(str(exc).split()) or type(exc).__name__)


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
    validate.add_argument("--list-steps", metavar="MOUNT", help="also list every step_N directory under MOUNT")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        report = validate_checkpoint(args.checkpoint_dir, _load_expectation(args))
    except (ExpectationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list_steps:
        report.steps_present = list_step_dirs(args.list_steps)
    if args.format == "text":
        print(report.to_text())
    else:
        # The human summary goes to stderr so stdout stays one machine-readable line; Ray's job log keeps both.
        print(report.to_text(), file=sys.stderr)
        print(MARKER + json.dumps(report.to_dict(), sort_keys=True, default=str), flush=True)
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
