"""The zero-learning guard: from the parsed steps, whether a GRPO run can learn at all (never had a learning
signal, lost it, or converged), and the message that says why it was stopped.

Pure and stdlib-only (the triggerer imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_gke.observe.metrics import StepMetrics

NEVER_LEARNED = "never_learned"
COLLAPSED = "collapsed"
CONVERGED = "converged"


@dataclass(frozen=True)
class ZeroLearningVerdict:
    """At least K trailing completed steps had no learning signal, what that means, and the steps and values.

    ``kind``: :data:`NEVER_LEARNED` (no step of this job, which started at the first step, had a signal: stop now),
    :data:`COLLAPSED` (the signal went away with every reward 0 after steps that had one, or after a resume: stop
    now) or :data:`CONVERGED` (after steps with a signal, or after a resume, the rewards stayed uniform but not all
    0: the model answers its prompts the same way every time; let the job reach its next checkpoint and succeed).
    ``decided_at`` is the K-th step of the streak, ``decided_index`` its position in the steps the check was given.
    """

    kind: str
    steps: tuple[str, ...]
    avg_rewards: tuple[float | None, ...]
    losses: tuple[float | None, ...]
    k: int
    decided_at: str
    decided_index: int
    message: str

    @property
    def stops_now(self) -> bool:
        """Whether the job should be stopped at once (nothing worth saving is lost) rather than at its next save."""
        return self.kind != CONVERGED

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, for a trigger event or XCom."""
        return {
            "kind": self.kind,
            "steps": list(self.steps),
            "avg_rewards": list(self.avg_rewards),
            "losses": list(self.losses),
            "k": self.k,
            "decided_at": self.decided_at,
            "message": self.message,
        }


def _uniform_reward(step: StepMetrics) -> bool:
    """Whether the batch mean of 0/1 rewards says every reward of the batch was the same."""
    return step.avg_reward is not None and step.avg_reward in (0.0, 1.0)


def _no_signal(step: StepMetrics) -> bool:
    """Whether the step had a zero policy gradient: uniform rewards or a loss of exactly 0."""
    return _uniform_reward(step) or step.loss == 0.0


def _first_of_training(step: StepMetrics) -> bool:
    """Whether a job's first step is the first of the training, not one after a resume from a checkpoint."""
    return step.step == 1 and step.epoch in (None, 1)


def check_zero_learning(steps: Sequence[StepMetrics], k: int) -> ZeroLearningVerdict | None:
    """A verdict when the last ``k`` (or more) completed steps all had no learning signal, else None.

    A step has none when its Avg Reward is exactly 0 or exactly 1 (NeMo RL prints the batch mean; with 0/1 rewards
    that means every reward was equal) or its loss is exactly 0. Steps still running are skipped. Only the trailing
    run of such steps counts: a run that recovered is left alone. Uniform prompt groups inside a mixed batch are
    invisible in the log, so the guard cannot catch them. The verdict's kind tells a run that never learned from one
    that learned and then converged (see :class:`ZeroLearningVerdict`).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    done = [(i, s) for i, s in enumerate(steps) if s.completed]
    streak: list[tuple[int, StepMetrics]] = []
    for index, step in reversed(done):
        if not _no_signal(step):
            break
        streak.append((index, step))
    if len(streak) < k:
        return None
    streak.reverse()
    uniform = [s for _, s in streak]
    learned_before = len(streak) < len(done) or not _first_of_training(done[0][1])
    if not learned_before:
        kind = NEVER_LEARNED
    elif any(s.avg_reward == 0.0 for s in uniform):
        kind = COLLAPSED
    else:
        kind = CONVERGED
    decided_index, decided = streak[k - 1]
    return ZeroLearningVerdict(
        kind=kind,
        steps=tuple(s.label for s in uniform),
        avg_rewards=tuple(s.avg_reward for s in uniform),
        losses=tuple(s.loss for s in uniform),
        k=k,
        decided_at=decided.label,
        decided_index=decided_index,
        message=_converged_message(uniform, k) if kind == CONVERGED else _zero_learning_message(uniform, k, kind),
    )


def _fmt(value: float | None) -> str:
    """A metric as NeMo RL prints it, or n/a."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def _streak_text(streak: list[StepMetrics]) -> str:
    """Which steps, and their rewards and losses."""
    labels = ", ".join(s.label for s in streak)
    rewards = ", ".join(_fmt(s.avg_reward) for s in streak)
    losses = ", ".join(_fmt(s.loss) for s in streak)
    return f"steps {labels} (Avg Reward: {rewards}; Loss: {losses})"


def _converged_message(streak: list[StepMetrics], k: int) -> str:
    """Explain a converged verdict: the run learned, then its rewards stopped varying."""
    return (
        f"Zero-learning guard (K={k}): the run converged at step {streak[k - 1].label}. After steps that had a "
        f"learning signal, {len(streak)} step(s) in a row had none: {_streak_text(streak)}. The model now answers "
        "each prompt the same way every time, so GRPO's advantages and gradient are 0 and further steps change "
        "nothing. The job runs to its next checkpoint save and is then stopped; that checkpoint is validated and "
        "exported and the run succeeds."
    )


def _zero_learning_message(streak: list[StepMetrics], k: int, kind: str) -> str:
    """Explain a verdict: which steps, their values, why nothing is learned, likely causes and the switch."""
    when = (
        "from the job's first step"
        if kind == NEVER_LEARNED
        else "after steps that had one (or since the job resumed from a checkpoint)"
    )
    parts = [
        f"Zero-learning guard (K={k}): {len(streak)} completed GRPO step(s) in a row had no learning signal "
        f"{when}: {_streak_text(streak)}.",
        "NeMo RL prints the batch mean of the rewards; with 0/1 rewards an Avg Reward of exactly 0 means every "
        "sampled response got 0 and exactly 1 means every response got 1, so all rewards are equal. GRPO's "
        "advantage is a response's reward minus the mean reward of its prompt's group, so every advantage is 0, "
        "the policy gradient is 0 and the model learns nothing; a loss of exactly 0 says the same directly. "
        "Further steps only burn GPU time.",
    ]
    if kind == COLLAPSED:
        parts.append(
            "Rewards that fall to 0 after a run learned mean the policy collapsed (a learning rate too high or a KL "
            "penalty too low are the usual causes). The checkpoints saved before the collapse stay on Lustre "
            "until exported or released."
        )
    elif any(s.avg_reward == 0.0 for s in streak):
        parts.append(
            "All rewards 0 usually means the reward function never matches the ground truth: check the format of "
            "the answer the grader gets. NeMo RL's math grader wraps the ground truth in \\boxed{} and compares it "
            "with the model's \\boxed{} answer (other graders expect a '#### N' final answer), so a dataset that "
            "passes the full worked solution as the answer (GSM8K's 'answer' column, ending in '#### N') instead "
            "of just N never matches. Also check that the prompt asks for the answer in the form the grader "
            "extracts and that the generation length limit does not cut answers off, or the task may be too hard "
            "for the model."
        )
    if any(s.avg_reward == 1.0 for s in streak):
        parts.append("All rewards 1 means the task is too easy for the model (or the grader accepts every answer).")
    if any(s.loss == 0.0 and not _uniform_reward(s) for s in streak):
        parts.append(
            "A loss of exactly 0 while the Avg Reward varies means every prompt group was uniform on its own "
            "(each prompt's responses all got the same reward) or every sample was masked out of the loss."
        )
    parts.append(
        "To switch this check off set the conf param zero_learning_guard to false; to allow more steps without a "
        f"learning signal raise zero_learning_steps (now {k})."
    )
    return " ".join(parts)
