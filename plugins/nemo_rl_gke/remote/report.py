"""The validator's findings: problems, recorded files, and the one report line the job log carries."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .expectation import Expectation
from .layout import DCP_PARTS

MARKER = "CHECKPOINT_REPORT_JSON: "


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
