"""Which failed jobs a run recovers from: rules kept as data, first match wins.

A GRPO job that fails because a node went away (a host died, hung, was preempted or repaired, a pod was evicted) can
resume from its newest checkpoint on a replacement node; one that fails on a bug would fail the same way again. Each
rule names what it matches in Ray's account of the failed job: its ``error_type``, an exception class named in the
message or the driver's last lines, or a message pattern. The first rule that matches decides; a failure no rule
matches is not recovered, and neither is one before the job's first step (a config error, a missing file, placement
that never worked: nothing learned is at stake, and a second try would only fail the same way).

What Ray reports for a lost node is in FACTS §18: ``ActorDiedError ... its node has died`` for a node that stopped
answering, ``ActorUnavailableError`` for one whose raylet died.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RecoveryRule:
    """One rule: what it matches (any of ``error_type``, ``exception``, ``pattern``), and whether to recover."""

    name: str
    recoverable: bool
    why: str
    error_type: str | None = None
    exception: str | None = None
    pattern: str | None = None

    def matches(self, error_type: str, text: str) -> bool:
        """Whether the failed job's ``error_type`` or text (Ray's message and the driver's last lines) match."""
        if self.error_type is not None and error_type == self.error_type:
            return True
        if self.exception is not None and re.search(rf"\b{re.escape(self.exception)}\b", text):
            return True
        return self.pattern is not None and re.search(self.pattern, text, re.IGNORECASE) is not None


# Bugs first: a traceback can name a node loss's exception in passing, but a config error is a config error.
RULES: tuple[RecoveryRule, ...] = (
    RecoveryRule(
        "lineage-guard",
        False,
        "the job refused to start on a checkpoint directory that is not this run's",
        pattern=r"nemo-rl-gke: not started",
    ),
    RecoveryRule(
        "config-error",
        False,
        "a config or override error fails every attempt alike",
        # The local trainer's "grpo_cpu.py: error: ...", and what Hydra and OmegaConf raise in NeMo RL.
        pattern=r"\bConfig(?:Key|Attribute|Value)?Error\b|OverrideParseException|MissingMandatoryValue|\.py: error: ",
    ),
    RecoveryRule(
        "gpus-short",
        False,
        "placement found too few GPUs even after NeMo RL's retries",
        exception="ResourceInsufficientError",
    ),
    RecoveryRule(
        "node-died", True, "a node stopped answering Ray's health checks", pattern=r"its node has died|NodeDiedError"
    ),
    RecoveryRule("actor-died", True, "a worker's actor died with its node or process", exception="ActorDiedError"),
    RecoveryRule("actor-unavailable", True, "a worker's raylet went away mid-call", exception="ActorUnavailableError"),
    RecoveryRule(
        "nccl-timeout",
        True,
        "a collective timed out (a peer GPU or NIC was lost)",
        pattern=r"NCCL (?:error|timeout)|Watchdog caught collective operation timeout|ProcessGroupNCCL.*timed? ?out",
    ),
    RecoveryRule(
        "preempted",
        True,
        "the node was preempted or reached its run duration (spot, flex-start)",
        pattern=r"preempt|impending-node-termination|maxRunDuration",
    ),
    RecoveryRule(
        "pod-lost",
        True,
        "a worker pod was evicted or lost with its node",
        pattern=r"\bEvicted\b|pod .* (?:was )?(?:evicted|lost|deleted)|The node was low on resource",
    ),
)


@dataclass(frozen=True)
class Verdict:
    """What the rules decided about one failed job."""

    rule: str
    recoverable: bool
    why: str

    def text(self) -> str:
        """One line for the task log."""
        decision = "recoverable" if self.recoverable else "not recoverable"
        return f"recovery rule {self.rule!r}: {decision} ({self.why})"


UNMATCHED = Verdict("no-rule", False, "no rule matched: a failure in the job itself is not retried")
BEFORE_FIRST_STEP = Verdict("before-first-step", False, "the job failed before its first step: nothing was learned")


def classify(
    error_type: str | None,
    message: str,
    tail: Sequence[str],
    steps_completed: int,
    rules: Sequence[RecoveryRule] = RULES,
) -> Verdict:
    """The verdict on a failed job from its Ray ``error_type``, message and last driver-log lines."""
    text = "\n".join([message, *tail])
    for rule in rules:
        if rule.matches(error_type or "", text):
            if rule.recoverable and steps_completed < 1:
                return BEFORE_FIRST_STEP
            return Verdict(rule.name, rule.recoverable, rule.why)
    return UNMATCHED
