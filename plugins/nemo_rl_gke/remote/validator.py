"""The checks, in order, of one NeMo RL checkpoint directory; :func:`validate_checkpoint` runs them.

About 500 lines, on purpose: the checks are one class's methods because they share one reader's state (the root's
descriptor, the links already refused, the files over their limit) and one report.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import limits
from .expectation import Expectation
from .layout import (
    CONSOLIDATED_DIR,
    DCP,
    DCP_PARTS,
    HF_METADATA_DIR,
    HF_METADATA_FILES,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    SHARD_RE,
    STEP_RE,
    TRAINING_INFO_KEYS,
    V2_MODEL_DIR,
    V2_OPTIM_DIR,
    VOCAB_FILES,
)
from .limits import (
    DIR_FLAGS,
    MAX_CONFIG_BYTES,
    MAX_HASHED_BYTES,
    MAX_JSON_DEPTH,
    MAX_LISTED,
    MAX_METADATA_BYTES,
    MAX_TOKENIZER_CONFIG_BYTES,
    MAX_TRAINING_INFO_BYTES,
)
from .metadata_shape import Budget, coverage_problem, metadata_problem
from .reading import sha256_of
from .report import FileRecord, Report
from .safe_yaml import BoundedSafeLoader, YamlAliasError
from .safetensors_checks import SafetensorsChecks
from .unpickler import RefusedPickleError, dcp_globals, load_dcp_metadata
from .values import MISSING, clip, json_depth, lookup, one_line, same, show


def validate_checkpoint(checkpoint_dir: str | Path, expect: Expectation | Mapping[str, Any] | None = None) -> Report:
    """Check one NeMo RL checkpoint directory (the parent of ``step_N``) against what the run should have made.

    Never raises for a broken checkpoint: every failure is a :class:`Problem` in the report. Raises
    :class:`ExpectationError` only when ``expect`` itself is malformed.
    """
    return Validator(Path(checkpoint_dir).absolute(), Expectation.from_dict(expect)).run()


class Validator(SafetensorsChecks):
    """Runs the checks in order and collects problems; one instance per validation."""

    def __init__(self, root: Path, expect: Expectation) -> None:
        super().__init__(root, Report(checkpoint_dir=str(root), expect=expect))
        self.expect = expect
        self.config: dict[str, Any] | None = None

    def run(self) -> Report:
        """Run every check that the layout allows and return the report."""
        if not self.root.is_dir():
            self.problem("step", "", f"checkpoint directory {self.root} does not exist or is not a directory")
            return self.report
        try:
            self.real_root = self.root.resolve(strict=True)
            self.root_fd = os.open(self.real_root, DIR_FLAGS)
        except (OSError, RuntimeError) as exc:
            self.problem("step", "", f"checkpoint directory {self.root} cannot be opened: {one_line(exc)}")
            return self.report
        try:
            step_dir = self.select_step()
            if step_dir is None:
                return self.report
            self.report.path = str(step_dir)
            self.check_config(step_dir / "config.yaml")
            self.check_training_info(step_dir / "training_info.json")
            self.check_weights_and_optimizer(step_dir / "policy")
            tokenizer_files: list[Path] = []
            if self.expect.has("tokenizer"):
                tokenizer_files = self.check_tokenizer(step_dir / "policy" / "tokenizer")
            self.check_nonempty_file(
                "dataloader", step_dir / "train_dataloader.pt", "torch.save(dataloader.state_dict())"
            )
            self.record_files(step_dir, tokenizer_files)
            return self.report
        finally:
            os.close(self.root_fd)

    # --- step directory -------------------------------------------------------------------------------------

    def select_step(self) -> Path | None:
        """Pick step_N (expected or highest) and reject unfinished saves (tmp_step_*, old_step_*)."""
        found: dict[str | None, list[int]] = {None: [], "tmp": [], "old": []}
        for entry in self.list_dir("step", self.root) or ():
            match = STEP_RE.fullmatch(entry.name)
            if match and self.inside(entry) is not None and entry.is_dir():
                found[match.group(1)].append(int(match.group(2)))
        steps, tmps, olds = (sorted(found[kind]) for kind in (None, "tmp", "old"))
        expected = self.expect.step
        final = expected if expected is not None else (steps[-1] if steps else None)

        self.unfinished_saves(steps, tmps, olds, final)

        listing = ", ".join(f"step_{n}" for n in steps) or "no step_* directory"
        if final is None:
            hint = ""
            if STEP_RE.fullmatch(self.root.name) and os.path.lexists(self.root / "training_info.json"):
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

    def unfinished_saves(self, steps: list[int], tmps: list[int], olds: list[int], final: int | None) -> None:
        """Report each unfinished save: a tmp_step_N never renamed (unless the stop cut it short after the final
        step), an old_step_N left by an interrupted finalize."""
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

    # --- config.yaml and training_info.json -----------------------------------------------------------------

    def check_config(self, path: Path) -> None:
        """config.yaml parses and has the expected values at the expected dotted keys."""
        text = self.read_text("config", path, "the run's master config", MAX_CONFIG_BYTES)
        if text is None:
            return
        try:
            config = yaml.load(text, Loader=BoundedSafeLoader)  # a SafeLoader subclass: plain data only
        except YamlAliasError as exc:
            self.problem("config", path, f"config.yaml is refused: {exc}")
            return
        except yaml.YAMLError as exc:
            self.problem("config", path, f"config.yaml does not parse as YAML: {one_line(exc)}")
            return
        except RecursionError:
            self.problem("config", path, "config.yaml nests too deeply to parse")
            return
        except ValueError as exc:  # e.g. an integer past Python's int/str conversion limit
            self.problem("config", path, f"config.yaml holds a value Python cannot convert: {one_line(exc)}")
            return
        if not isinstance(config, dict):
            self.problem("config", path, f"config.yaml holds a {type(config).__name__}, not a mapping")
            return
        self.config = config
        for key, want in self.expect.config.items():
            have = lookup(config, key)
            if have is MISSING:
                self.problem("config", path, f"{key} is missing from config.yaml; expected {json.dumps(want)}")
            elif not same(have, want):
                self.problem(
                    "config",
                    path,
                    f"{key} is {show(have)} in config.yaml, but the run was submitted with "
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
            self.problem("training_info", path, f"training_info.json is not valid JSON: {one_line(exc)}")
            return
        except RecursionError:
            info = None
        if info is None or json_depth(info) > MAX_JSON_DEPTH:
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
        async_grpo = lookup(self.config or {}, "grpo.async_grpo.enabled") is True
        key = "current_step" if async_grpo else "total_steps"
        step = self.report.step
        if key in info and (isinstance(info[key], bool) or info[key] != step):
            why = "async GRPO's step counter" if async_grpo else "GRPO's step counter across epochs"
            self.problem(
                "training_info",
                path,
                f"training_info.json {key} is {show(info[key])}, expected {step} for step_{step} "
                f"({key} is {why}, which names the directory)",
            )

    # --- the weights and the optimizer, as the release's save path lays them out -------------------------------

    def check_weights_and_optimizer(self, policy: Path) -> None:
        """v1: DCP in policy/weights and policy/optimizer. v2: Automodel's policy/weights/model (sharded safetensors,
        or DCP with torch_save) and DCP in policy/optimizer/optim (absent with save_optimizer=false)."""
        fmt = self.expect.format
        if fmt == DCP:
            self.check_dcp("weights", policy / "weights")
        elif fmt == SAFETENSORS:
            self.check_safetensors(
                policy / "weights" / V2_MODEL_DIR, self.expect.training_ranks, self.expect.has("consolidated")
            )
        else:
            self.check_dcp("weights", policy / "weights" / V2_MODEL_DIR)
        if self.expect.has("optimizer"):
            self.check_dcp("optimizer", policy / "optimizer" / (V2_OPTIM_DIR if fmt != DCP else ""))

    # --- torch.distributed.checkpoint directories -----------------------------------------------------------

    def check_dcp(self, part: str, directory: Path) -> None:
        """Shard files (one per training rank, none empty), .metadata readable, chunks and storage consistent."""
        if self.inside(directory) is None:
            return
        if not directory.is_dir():
            parts = directory.parts
            where = "/".join(parts[len(parts) - 1 - parts[::-1].index("policy") :])
            self.problem("shards", directory, f"{where} is missing: NeMo RL writes the {part} there with dcp.save")
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
            match = SHARD_RE.fullmatch(entry.name)
            if match and match.group(2) == "0" and int(match.group(1)) >= limits.MAX_DIR_ENTRIES:
                # No directory this validator reads holds that many shards; counting up to it would never end.
                misnamed.append(
                    (
                        entry,
                        f"shard {clip(entry.name)} names a rank beyond the {limits.MAX_DIR_ENTRIES:,} a DCP directory "
                        "can hold here",
                    )
                )
            elif match and match.group(2) == "0":
                ranks.append(int(match.group(1)))
            else:
                misnamed.append(
                    (
                        entry,
                        f"unexpected shard file name {clip(entry.name)}: NeMo RL's dcp.save writes one "
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
                    "; this directory holds safetensors: the checkpoint is the v2 worker's model_save_format="
                    "safetensors layout, not the one the run's config asked for"
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
                f"metadata file: {type(exc).__name__}: {one_line(exc)}",
            )
            return None
        classes = dcp_globals()
        if type(metadata) is not classes[("torch.distributed.checkpoint.metadata", "Metadata")]:
            self.problem(
                "metadata",
                path,
                f"policy/{part}/.metadata holds a {type(metadata).__name__}, not a DCP Metadata",
            )
            return None
        malformed = metadata_problem(metadata, classes)
        if malformed:
            self.problem("metadata", path, f"policy/{part}/.metadata is not well-formed DCP metadata: {malformed}")
            return None
        return metadata

    def check_chunks(self, directory: Path, metadata: Any) -> None:
        """Every tensor's chunks lie inside it, do not overlap and together cover it exactly."""
        reasons = []
        budget = Budget(limits.MAX_OVERLAP_CHECKS)
        for fqn, item in metadata.state_dict_metadata.items():
            if not hasattr(item, "chunks"):
                continue  # BytesStorageMetadata: a pickled object, no chunks to cover
            self.report.tensors += 1
            chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in item.chunks]
            reason = coverage_problem(tuple(item.size), chunks, budget)
            if reason:
                reasons.append(f"tensor {clip(fqn)} of size {list(item.size)}: {reason}")
        self.capped("metadata", directory / ".metadata", reasons, "tensors whose chunks do not cover them")
        if budget.exhausted:
            self.problem(
                "metadata",
                directory / ".metadata",
                f"stopped checking chunks for overlaps after {limits.MAX_OVERLAP_CHECKS:,} comparisons: no DCP save "
                "needs that many, so the chunks are laid out to make the check slow",
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
                    f"storage entry of {clip(index.fqn)} is malformed: {clip(repr(name))} at {start} length {length}"
                )
                continue
            count, end = ends.get(name, (0, 0))
            ends[name] = (count + 1, max(end, start + length))
        for name, (count, end) in sorted(ends.items()):
            if name not in sizes:
                exists = os.path.lexists(directory / name)
                what = "is not a .distcp shard" if exists else "does not exist"
                bad.append(f"{count} storage entries point at {clip(name)}, which {what}")
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
                    missing.append(f"no storage entry for {clip(fqn)}")
                continue
            missing += [
                f"no storage entry for {clip(fqn)} chunk at offsets {list(c.offsets)}"
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
        shown = clip(", ".join(names))
        config = directory / "tokenizer_config.json"
        if not os.path.lexists(config):
            self.problem("tokenizer", config, f"tokenizer_config.json is missing (found {shown})")
        else:
            text = self.read_text("tokenizer", config, "the tokenizer's config", MAX_TOKENIZER_CONFIG_BYTES)
            try:
                if text is not None:
                    json.loads(text)
            except (ValueError, RecursionError) as exc:
                self.problem("tokenizer", config, f"tokenizer_config.json is not valid JSON: {one_line(exc)}")
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
        bounds = {
            step_dir / "config.yaml": MAX_CONFIG_BYTES,
            step_dir / "training_info.json": MAX_TRAINING_INFO_BYTES,
            step_dir / "train_dataloader.pt": MAX_HASHED_BYTES,
        }
        model = step_dir / "policy" / "weights" / V2_MODEL_DIR
        if self.expect.format == DCP:
            bounds.update({step_dir / "policy" / part / ".metadata": MAX_METADATA_BYTES for part in DCP_PARTS})
        else:
            bounds[step_dir / "policy" / "optimizer" / V2_OPTIM_DIR / ".metadata"] = MAX_METADATA_BYTES
            if self.expect.format == SAFETENSORS and self.expect.has("consolidated"):
                consolidated = model / CONSOLIDATED_DIR
                bounds.update({consolidated / n: MAX_HASHED_BYTES for n in ("config.json", SAFETENSORS_INDEX)})
            elif self.expect.format == SAFETENSORS:
                bounds.update({model / HF_METADATA_DIR / name: MAX_HASHED_BYTES for name in HF_METADATA_FILES})
            else:
                bounds[model / ".metadata"] = MAX_METADATA_BYTES
        bounds.update({path: MAX_HASHED_BYTES for path in tokenizer_files})
        for path, limit in bounds.items():
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
                size, digest = sha256_of(handle, limit)
            if size > limit:
                self.problem("files", path, f"{path.name} grew past {limit:,} bytes while it was hashed")
                continue
            self.report.files.append(FileRecord(path.relative_to(self.root).as_posix(), size, digest))
