"""Whether a run's model is published: the publish policy, its score, and the last published model's.

A decision of the run's, as plain code: the publish step reads the scores and the last published event, calls
:func:`decide`, and acts (the published-model Asset event, or a skip the alert and report explain). Every run's
checkpoint is exported whatever this says: nothing learned is lost, only the lineage's published model is chosen here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nemo_rl_gke.run.publish import ALWAYS, NEVER, NOT_PROMOTED, NOT_PUBLISHED, PROMOTED


@dataclass(frozen=True)
class Decision:
    """What the publish step does, and why, in words people read in the alert, the report and the view."""

    outcome: str
    reason: str
    score: float | None
    baseline: float | None
    published: float | None

    @property
    def promoted(self) -> bool:
        """Whether the model becomes the lineage's published one."""
        return self.outcome == PROMOTED

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (XCom)."""
        return asdict(self)


def decide(
    policy: str,
    margin: float,
    score: float | None,
    *,
    baseline: float | None = None,
    published: Mapping[str, Any] | None = None,
) -> Decision:
    """The decision for a model that scored ``score`` (None: not evaluated), given the last published model's event
    extra (``published``: None when none was published yet) and the base model's score."""
    last = published.get("score") if published else None
    last = float(last) if isinstance(last, int | float) and not isinstance(last, bool) else None
    facts = {"score": score, "baseline": baseline, "published": last}
    if policy == NEVER:
        return Decision(NOT_PUBLISHED, "publish=never: the checkpoint is exported, nothing is published", **facts)
    if policy == ALWAYS:
        return Decision(PROMOTED, "publish=always: every run's model is published", **facts)
    if score is None:
        return Decision(NOT_PROMOTED, "publish=if_better, but the model has no score (the evaluation did not run)",
                        **facts)  # fmt: skip
    if last is None:
        return Decision(PROMOTED, f"the first published model of this lineage (score {score:.4f})", **facts)
    bar = last + margin
    if score >= bar:
        return Decision(
            PROMOTED,
            f"score {score:.4f} is at least the published model's {last:.4f} + margin {margin:g}",
            **facts,
        )
    return Decision(
        NOT_PROMOTED,
        f"score {score:.4f} is below the published model's {last:.4f} + margin {margin:g} = {bar:.4f}",
        **facts,
    )
