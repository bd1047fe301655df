"""Preflight findings: one violated rule, said so a user can fix it without reading code.

A finding goes to the task log, XCom, the CLI and the run report, and its value comes from an untrusted conf. So the
value is made safe when the finding is built: truncated (at most :data:`MAX_SHOWN` characters), JSON-friendly (no
NaN, no 5,000-digit integers), and redacted when it looks like a credential.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_SHOWN = 80
MAX_TEXT = 600
REDACTED = "<redacted>"
ELLIPSIS = "…"
# Credential formats worth recognising wherever they appear: vendor-prefixed tokens, JWTs and PEM keys. Matching too
# much only hides a value from a message; matching too little leaks it.
_PREFIXED = (
    r"hf_[A-Za-z0-9]{16,}|api_org_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}"
    r"|ya29\.[0-9A-Za-z_-]{16,}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.|-----BEGIN [A-Z ]*PRIVATE KEY"
)
# A W&B API key is 40 hex digits: redacted when echoed, but not refused (a commit SHA looks the same).
_HEX40 = r"(?<![0-9A-Fa-f])[0-9a-f]{40}(?![0-9A-Fa-f])"
SECRET_VALUE = re.compile(f"{_PREFIXED}|{_HEX40}")
CREDENTIAL_VALUE = re.compile(_PREFIXED)
# Only this much of a value is ever searched: what is shown, plus enough to catch a token straddling the cut.
_SCAN = MAX_TEXT + 128
_MAX_INT_DIGITS = 30
_MAX_ITEMS = 8
_MAX_DEPTH = 3


def looks_like_secret(text: str) -> bool:
    """Whether the start of ``text`` (the part a message could show) holds something shaped like a token or key."""
    return bool(SECRET_VALUE.search(text, 0, _SCAN))


def truncate(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def display_value(value: Any) -> Any:
    """A JSON-friendly, bounded, redacted stand-in for any conf value: what a finding may echo."""
    return _safe(value, 0)


def shown(value: Any) -> str:
    """A short literal of ``value`` for a message: strings quoted, everything bounded and redacted."""
    safe = display_value(value)
    if isinstance(safe, str) and safe.startswith("<") and safe.endswith(">"):
        return safe  # a placeholder such as <redacted>, not the user's text
    try:
        return truncate(repr(safe) if isinstance(safe, str) else json.dumps(safe, ensure_ascii=False))
    except (TypeError, ValueError):
        return f"<{type(value).__name__}>"


def _safe(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # str() of a huge int raises (Python's 4,300-digit limit) and helps nobody: say how big it is instead.
        if abs(value) < 10**_MAX_INT_DIGITS:
            return int(value)
        return f"<integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return REDACTED if looks_like_secret(value) else truncate(value)
    if isinstance(value, (list, tuple, dict)):
        return _safe_container(value, depth)
    return f"<{type(value).__name__}>"


def _safe_container(value: list[Any] | tuple[Any, ...] | dict[Any, Any], depth: int) -> Any:
    if depth >= _MAX_DEPTH:
        return f"<{type(value).__name__} nested too deep to show>"
    if isinstance(value, dict):
        items = list(value.items())[:_MAX_ITEMS]
        out: Any = {truncate(str(_safe(k, depth + 1)), 40): _safe(v, depth + 1) for k, v in items}
    else:
        out = [_safe(v, depth + 1) for v in list(value)[:_MAX_ITEMS]]
    text = json.dumps(out, ensure_ascii=False)
    if len(value) > _MAX_ITEMS or len(text) > MAX_SHOWN:
        return truncate(text)
    return out


# A run of more than MAX_SHOWN characters without a space, or a quoted literal that long: a value a rule quoted.
_LONG = f"{{{MAX_SHOWN + 1},}}"
# A quote right after or before a letter is an apostrophe ("the job's ... checkpoint's"), not a quoted value.
_LONG_RUN = re.compile(rf"\S{_LONG}|(?<!\w)'[^']{_LONG}'(?!\w)|\"[^\"]{_LONG}\"")


def safe_text(text: str, limit: int = MAX_TEXT) -> str:
    """A rule or fix text made safe to show: credentials redacted, every quoted value cut to :data:`MAX_SHOWN`
    characters (rules quote conf values in their messages), the whole bounded."""
    redacted = SECRET_VALUE.sub(REDACTED, text[:_SCAN])
    return truncate(_LONG_RUN.sub(lambda m: truncate(m.group()), redacted), limit)


@dataclass(frozen=True)
class Finding:
    """One violated rule: which parameter, which value, which rule, and how to fix it.

    ``params`` names every conf parameter the rule looked at; the first is the one to change. The value is stored
    already made safe (see :func:`display_value`), so nothing downstream can echo more of the conf than this.
    """

    rule_id: str
    params: tuple[str, ...]
    value: Any
    rule: str
    fix: str

    def __post_init__(self) -> None:
        # Frozen: the safe forms replace the raw ones once, here.
        object.__setattr__(self, "value", display_value(self.value))
        object.__setattr__(self, "params", tuple(truncate(str(p)) for p in self.params) or ("conf",))
        object.__setattr__(self, "rule", safe_text(str(self.rule)))
        object.__setattr__(self, "fix", safe_text(str(self.fix)))

    @property
    def param(self) -> str:
        """The parameter the user should change first."""
        return self.params[0]

    def __str__(self) -> str:
        shown_value = json.dumps(self.value, default=str, ensure_ascii=False)
        return f"[{self.rule_id}] {self.param}={shown_value}: {self.rule}. Fix: {self.fix}"

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
