"""Continual training (``resume=latest`` or ``promoted``): the lineage read from the DAG's Asset events, the step
the run continues from, how far it trains and what it sets aside. Pure functions; the resume step
(:class:`~nemo_rl_gke.operators.checkpoint.ResumeOperator`) reads the events and sends the import."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.steps import step_budget

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# How many of the lineage's latest checkpoints the resume step reads (the report shows them).
LINEAGE_SHOWN = 30


class ResumeBudgetError(ValueError):
    """The resumed run would train nothing, or the recipe's epoch cap would cut it."""


def lineage_of(events: Iterable[Any]) -> list[dict[str, Any]]:
    """The lineage in Asset events (oldest first; each with ``extra``, ``source_dag_id``, ``source_run_id``): run,
    step, URI, parent and the night's rewards of each export. Events another producer wrote are skipped."""
    found = []
    for event in events:
        extra = event.extra or {}
        if not isinstance(extra.get("uri"), str) or not isinstance(extra.get("step"), int):
            continue  # an event some other producer wrote: not one of ours
        metrics = extra.get("metrics") or {}
        found.append(
            {
                "run": f"{event.source_dag_id}/{event.source_run_id}",
                "step": extra["step"],
                "uri": extra["uri"],
                "parent": extra.get("parent"),
                "first_reward": metrics.get("first_reward"),
                "last_reward": metrics.get("last_reward"),
            }
        )
    return found


def startups_of(events: Iterable[Any], recipe: str) -> list[float]:
    """Seconds from the submit to NeMo RL's setup end that this DAG's exported runs of ``recipe`` measured, oldest
    first (the export's Asset event carries them): what the next submit reserves for its setup."""
    found = []
    for event in events:
        extra = event.extra or {}
        seconds = (extra.get("metrics") or {}).get("startup_s")
        if extra.get("recipe") == recipe and isinstance(seconds, int | float) and not isinstance(seconds, bool):
            found.append(float(seconds))
    return found


@dataclass(frozen=True)
class ResumePoint:
    """Where a ``resume=latest`` run starts: its parent checkpoint (None: from scratch), that step, and the
    ``max_steps`` it trains to (the step plus ``steps_per_run``, or the conf's ``max_steps`` without a budget)."""

    parent: dict[str, Any] | None
    start: int
    max_steps: int


def resume_point(spec: RunSpec, lineage: list[dict[str, Any]]) -> ResumePoint:
    """The lineage's newest checkpoint and the step budget on top of it."""
    parent = lineage[-1] if lineage else None
    start = int(parent["step"]) if parent else 0
    max_steps = start + spec.steps_per_run if spec.steps_per_run else spec.max_steps
    return ResumePoint(parent, start, max_steps)


def set_aside(spec: RunSpec, exported: list[dict[str, Any]], start: int) -> list[int]:
    """The steps a ``resume=promoted`` job moves out of ``checkpoint_dir`` before it trains: this DAG's exported
    checkpoints past the published one it starts from (nights that were not promoted; NeMo RL would resume from the
    highest). Only steps this lineage exported: anything else there still stops the job (the lineage guard)."""
    if spec.resume != "promoted":
        return []
    return sorted({int(e["step"]) for e in exported if int(e["step"]) > start})


def check_resume_budget(spec: RunSpec, start: int, max_steps: int) -> str:
    """The step budget in words; raises :class:`ResumeBudgetError` for a run that would train nothing, or that the
    recipe dataset's epoch cap would cut."""
    if max_steps <= start:
        raise ResumeBudgetError(
            f"max_steps={max_steps} is not past the resumed step {start}: NeMo RL would exit at once. Fix: set "
            "steps_per_run (the steps to train past the resumed step) or a larger max_steps."
        )
    budget = step_budget(dataclasses.replace(spec, max_steps=max_steps), load_recipe(spec.recipe))
    if budget is None:
        return f"step {start} + {max_steps - start} = max_steps {max_steps}"
    if budget.capped:
        raise ResumeBudgetError(
            f"resumed step {start} + steps_per_run {spec.steps_per_run} = {max_steps}, but the recipe's epoch cap "
            f"ends the job first: {budget.explain()}. Nothing was started."
        )
    return f"step {start} + {max_steps - start} = {budget.explain()}"
