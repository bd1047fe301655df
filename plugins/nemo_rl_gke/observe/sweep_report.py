"""What one sweep found, deleted, kept and skipped, per run group: a table for the task log, a dict for XCom.

Pure and stdlib-only. A kept resource always says why, so it never reads like a deleted one (DESIGN rule 9).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from nemo_rl_gke.run.times import shown_or_dash


@dataclass(frozen=True)
class Kept:
    """A resource the sweep did not delete: which, the outcome word, and why."""

    resource: str
    action: str
    reason: str


@dataclass(frozen=True)
class GroupReport:
    """One run group of the project's lease records.

    :param why: why the sweep took it on (or, when ``skipped``, the same reason it did not).
    :param skipped: why the sweep left the group alone ('' when it swept it).
    :param found: every resource of the group that existed when the sweep looked (whoever's).
    :param deleted: what it deleted (a dry run: what it would delete).
    :param kept: what it kept, with the outcome and the reason.
    :param failed: what it tried to delete and could not (the next sweep tries again).
    :param lease: what became of the group's lease record.
    :param notes: what goes with something else (the node pool and Kubernetes objects with the cluster).
    """

    group: str
    why: str
    skipped: str = ""
    found: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    kept: tuple[Kept, ...] = ()
    failed: tuple[Kept, ...] = ()
    lease: str = ""
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class SweepReport:
    """The report of one sweep of one project."""

    project: str
    deployment: str
    run: str
    dry_run: bool
    at: float
    groups: tuple[GroupReport, ...] = ()

    @property
    def swept(self) -> tuple[GroupReport, ...]:
        """The groups the sweep took on."""
        return tuple(g for g in self.groups if not g.skipped)

    @property
    def skipped(self) -> tuple[GroupReport, ...]:
        """The groups it left alone."""
        return tuple(g for g in self.groups if g.skipped)

    @property
    def failed(self) -> bool:
        """Whether any deletion failed."""
        return any(g.failed for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        """JSON values (lists, not tuples: what XCom hands back), for XCom."""
        return json.loads(json.dumps({**asdict(self), "at": shown_or_dash(self.at)}))

    def to_text(self) -> str:
        """The report as the task log shows it: a summary line, one table row per swept group with its details
        below, then the skipped groups with their reasons."""
        verb = "would delete" if self.dry_run else "deleted"
        mode = " (dry run: nothing was written)" if self.dry_run else ""
        lines = [
            f"Sweep of project {self.project} by deployment {self.deployment} ({self.run}) at "
            f"{shown_or_dash(self.at)}{mode}",
            f"{len(self.swept)} group(s) swept, {len(self.skipped)} skipped; {sum(len(g.deleted) for g in self.swept)}"
            f" resource(s) {'would be deleted' if self.dry_run else 'deleted'}, {sum(len(g.kept) for g in self.swept)}"
            " kept, "
            f"{sum(len(g.failed) for g in self.swept)} failed",
        ]
        if self.swept:
            header = ("group", "found", verb, "kept", "failed", "lease")
            rows = [
                (g.group, str(len(g.found)), str(len(g.deleted)), str(len(g.kept)), str(len(g.failed)), g.lease)
                for g in self.swept
            ]
            widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
            lines.append("")
            for row in (header, *rows):
                lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
            for g in self.swept:
                lines += ["", f"{g.group}: {g.why}"]
                lines += [f"  {verb}: {name}" for name in g.deleted]
                lines += [f"  kept ({k.action}): {k.resource}: {k.reason}" for k in g.kept]
                lines += [f"  failed: {k.resource}: {k.reason}" for k in g.failed]
                lines += [f"  note: {note}" for note in g.notes]
        if self.skipped:
            lines += ["", "skipped:"]
            lines += [f"  {g.group}: {g.skipped}" for g in self.skipped]
        if not self.groups:
            lines += ["", "no lease records in the project"]
        return "\n".join(lines)
