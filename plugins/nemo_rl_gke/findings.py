"""Preflight findings: one violated rule, said so a user can fix it without reading code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One violated rule: which parameter, which value, which rule, and how to fix it.

    ``params`` names every conf parameter the rule looked at; the first is the one to change.
    """

    rule_id: str
    params: tuple[str, ...]
    value: Any
    rule: str
    fix: str

    @property
    def param(self) -> str:
        """The parameter the user should change first."""
        return self.params[0]

    def __str__(self) -> str:
        shown = json.dumps(self.value, default=str)
        return f"[{self.rule_id}] {self.param}={shown}: {self.rule}. Fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, for the CLI's json output and XCom."""
        return {
            "rule_id": self.rule_id,
            "param": self.param,
            "params": list(self.params),
            "value": self.value,
            "rule": self.rule,
            "fix": self.fix,
        }


class ConfError(ValueError):
    """The conf breaks one or more rules; nothing was created."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = list(findings)
        super().__init__(format_findings(self.findings))


def format_findings(findings: list[Finding]) -> str:
    """Render findings as the numbered list users see in the task log and the CLI."""
    lines = [f"{len(findings)} problem(s) in the run conf; nothing was created:"]
    lines += [f"  {i}. {finding}" for i, finding in enumerate(findings, 1)]
    return "\n".join(lines)
