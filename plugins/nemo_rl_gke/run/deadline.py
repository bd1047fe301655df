"""One clock for every stop of the training job: the run's deadline, the job's own save deadline and the hard stop.

Four limits can end a run's training, each an epoch second (:class:`Limit`), and the earliest is the run's deadline:

* ``max_run_hours``: the run's hours, counted from its start (provisioning spends them too);
* ``max_run_usd``: its USD at the served capacity's price (:func:`nemo_rl_gke.run.costs.gpu_hour_price`), counted
  from when the GPU pool came up: the run report's cost model, so every figure of a run prices the same moment alike;
* ``capacity_end``: flex-start's ``maxRunDuration`` (queued's ``maxRunDurationSeconds``), counted from when the served
  rung's wait began (its nodes start after that). GKE removes the nodes then: it is *hard*, nothing runs past it;
* ``job_timeout_s``: counted from the job's first submission.

NeMo RL takes no save request from outside. ``checkpointing.checkpoint_must_save_by`` is the only way to make it save
before a time, and its ``TimeoutChecker`` (``nemo_rl/utils/timer.py``) starts that clock in ``grpo_train``
(``nemo_rl/algorithms/grpo.py:1002`` at v0.5.0, ``:2147`` at v0.7.0), after the setup that ends by printing
``SETUP COMPLETE`` and ``Total setup time`` (``grpo.py:643-646`` / ``:1230-1233``): loading a 27B model takes minutes.
So the room for that setup is made on both sides (docs/deadlines.md says why both):

* **up front** (:meth:`RunClock.save_by`): the job gets the time left less a reserve for its setup
  (:func:`setup_reserve`: this DAG's earlier runs of the recipe, else the recipe's ``setup_s``) and less a margin for
  the save itself;
* **at the end** (:meth:`RunClock.stop_at`): the trigger sees ``SETUP COMPLETE`` in the log, so it knows when the
  job's clock started and when its deadline save is due. It stops the job at the deadline, or, when that save is due
  later, waits for it: up to the deployment's ``budget_overrun_minutes`` past a soft limit, never past a hard one.

Pure and stdlib-only: the triggerer imports it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The save NeMo RL makes at its deadline needs time: a tenth of what is left, at most 10 min.
SAVE_MARGIN_S = 600.0
SAVE_MARGIN_SHARE = 0.1
# The reserve measured on earlier runs is the slowest of the newest few setups, with this much to spare.
SETUP_RESERVE_FACTOR = 1.25
SETUP_SAMPLES = 5
# At most this share of the time left is reserved for setup, so a tight deadline still leaves room to train; the
# overrun (or the loud loss) covers a setup slower than that.
MAX_RESERVE_SHARE = 0.5

# "Near the stop": less than one mean step and this margin left (the save at the end of the step needs it).
NEAR_MARGIN_S = 60.0
# What the trigger does with a running job (RunClock.decide).
GO_ON = "go-on"
STOP = "stop"
STOP_AT_NEXT_SAVE = "stop-at-next-save"

# The limits' kinds: the conf or deployment parameter each comes from.
HOURS = "max_run_hours"
USD = "max_run_usd"
CAPACITY_END = "capacity_end"
JOB_TIMEOUT = "job_timeout_s"


class BudgetSpentError(ValueError):
    """The run's deadline left no time to train before the job could start."""


@dataclass(frozen=True)
class Limit:
    """One limit on the run's training: what it is, when it falls (epoch seconds) and whether nothing may run past
    it (``hard``: GKE removes the nodes) or the deployment's overrun may finish a save after it."""

    kind: str
    at: float
    hard: bool
    what: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (trigger kwargs, XCom)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limit:
        """Rebuild from :meth:`to_dict`."""
        return cls(str(data["kind"]), float(data["at"]), bool(data["hard"]), str(data["what"]))


@dataclass(frozen=True)
class SetupReserve:
    """The seconds reserved up front for the job's setup, and where the figure comes from."""

    seconds: float
    source: str


def setup_reserve(recipe_setup_s: float, measured: Sequence[float]) -> SetupReserve:
    """The setup reserve: the slowest of the newest :data:`SETUP_SAMPLES` setups measured on earlier runs of the
    recipe (seconds from the submit to NeMo RL's ``SETUP COMPLETE``) times :data:`SETUP_RESERVE_FACTOR`, else the
    recipe's ``setup_s``."""
    samples = [float(s) for s in measured if isinstance(s, int | float) and math.isfinite(s) and s > 0]
    samples = samples[-SETUP_SAMPLES:]
    if not samples:
        return SetupReserve(float(recipe_setup_s), f"the recipe's setup_s ({recipe_setup_s:.0f} s)")
    slowest = max(samples)
    runs = "run" if len(samples) == 1 else "runs"
    return SetupReserve(
        slowest * SETUP_RESERVE_FACTOR,
        f"{SETUP_RESERVE_FACTOR:g} x the slowest setup of the last {len(samples)} {runs} of the recipe "
        f"({slowest:.0f} s)",
    )


def save_margin(seconds_left: float) -> float:
    """The time kept for the deadline save itself."""
    return min(SAVE_MARGIN_S, SAVE_MARGIN_SHARE * max(seconds_left, 0.0))


def duration_text(seconds: float) -> str:
    """NeMo RL's "DD:HH:MM:SS" (``convert_to_seconds`` in ``nemo_rl/utils/timer.py`` reads it back)."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


@dataclass(frozen=True)
class SaveBy:
    """What the submit gives the job: ``checkpoint_must_save_by`` in seconds (counted by NeMo RL from its setup's
    end) and how it was made: the time left, less the setup reserve and the save margin."""

    seconds: int
    left_s: float
    reserve: SetupReserve
    reserve_s: float
    margin_s: float

    def to_dict(self) -> dict[str, Any]:
        """What the submit's result keeps (the sensor gives it to the trigger's clock)."""
        return {
            "seconds": self.seconds,
            "text": self.text,
            "margin_s": round(self.margin_s, 3),
            "reserve_s": round(self.reserve_s, 3),
            "reserve_source": self.reserve.source,
        }

    @property
    def text(self) -> str:
        """The override's value, "DD:HH:MM:SS"."""
        return duration_text(self.seconds)

    def explain(self) -> str:
        """How the figure was made, for the task log and the plan."""
        cut = "" if self.reserve_s >= self.reserve.seconds else f", cut to {MAX_RESERVE_SHARE:.0%} of the time left"
        return (
            f"{self.left_s:.0f} s left, less {self.reserve_s:.0f} s reserved for NeMo RL's setup ({self.reserve.source}"
            f"{cut}) and {self.margin_s:.0f} s for the save"
        )


@dataclass(frozen=True)
class Loss:
    """What a stop threw away: the steps completed after the newest save and the GPU-hours they took (the whole
    attempt's when nothing was saved), and why."""

    steps: int
    gpu_hours: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the event, XCom, the report)."""
        return {"steps": self.steps, "gpu_hours": round(self.gpu_hours, 4), "why": self.why}

    def text(self) -> str:
        """One line: "lost 12 steps (0.40 GPU-hours): why"."""
        return f"lost {self.steps} step(s) ({self.gpu_hours:.2f} GPU-hours): {self.why}"


@dataclass(frozen=True)
class RunClock:
    """Every limit of one run, the deployment's overrun, and the price its USD figures are counted at.

    ``usd_per_hour`` is the served capacity's rate for the run's GPU nodes and ``usd_since`` when the GPU pool came
    up (None: unknown); ``gpus`` counts the run's GPUs (for GPU-hours lost); ``job_save_by_s`` and ``save_margin_s``
    are what the submit gave the job (0: the job was given no deadline).
    """

    limits: tuple[Limit, ...] = ()
    overrun_s: float = 0.0
    usd_per_hour: float | None = None
    usd_since: float | None = None
    gpus: int = 0
    job_save_by_s: float = 0.0
    save_margin_s: float = 0.0

    @property
    def deadline(self) -> Limit | None:
        """The earliest limit (None: the run has none)."""
        return min(self.limits, key=lambda limit: limit.at) if self.limits else None

    @property
    def hard_end(self) -> Limit | None:
        """The earliest limit nothing may run past."""
        hard = [limit for limit in self.limits if limit.hard]
        return min(hard, key=lambda limit: limit.at) if hard else None

    @property
    def cap(self) -> float:
        """The latest the job may be stopped: the deadline, plus the overrun when it is soft, never past a hard end."""
        deadline = self.deadline
        if deadline is None:
            return math.inf
        latest = deadline.at if deadline.hard else deadline.at + self.overrun_s
        hard = self.hard_end
        return min(latest, hard.at) if hard is not None else latest

    def save_by(self, now: float, reserve: SetupReserve) -> SaveBy | None:
        """The job's ``checkpoint_must_save_by`` for a submit at ``now`` (None: no deadline); raises
        :class:`BudgetSpentError` when nothing is left to train in."""
        deadline = self.deadline
        if deadline is None:
            return None
        left = deadline.at - now
        margin = save_margin(left)
        reserve_s = min(reserve.seconds, MAX_RESERVE_SHARE * max(left, 0.0))
        usable = left - reserve_s - margin
        if not math.isfinite(usable) or usable < 1:
            raise BudgetSpentError(
                f"{max(left, 0.0):.0f}s is left before {deadline.what}: no time to train once NeMo RL's setup "
                f"({reserve_s:.0f}s reserved) and the save ({margin:.0f}s) are counted"
            )
        return SaveBy(int(usable), left, reserve, reserve_s, margin)

    def with_job(self, job_save_by_s: float, save_margin_s: float) -> RunClock:
        """This clock with what the submit gave the job (its ``checkpoint_must_save_by`` and save margin, seconds)."""
        return dataclasses.replace(self, job_save_by_s=float(job_save_by_s), save_margin_s=float(save_margin_s))

    def job_save_due(self, setup_done_at: float | None) -> float | None:
        """When the job's own deadline save is done: NeMo RL's clock starts at its setup's end (None: not seen yet,
        or the job has no deadline)."""
        if setup_done_at is None or not self.job_save_by_s:
            return None
        return setup_done_at + self.job_save_by_s + self.save_margin_s

    def stop_at(self, setup_done_at: float | None) -> float:
        """When the trigger stops the job: at the deadline, or later (up to :attr:`cap`) while the job's own
        deadline save is due after it, or its setup has not ended yet (NeMo RL's clock has not even started)."""
        deadline = self.deadline
        if deadline is None:
            return math.inf
        due = self.job_save_due(setup_done_at)
        if self.job_save_by_s and due is None:
            due = math.inf  # still setting up: only waiting can let it save
        if due is None:
            return deadline.at
        return max(deadline.at, min(due, self.cap))

    def decide(self, now: float, *, setup_done_at: float | None, mean_step_s: float | None, save_begun: bool) -> str:
        """What the trigger does with the running job now: :data:`STOP` it (the stop has come, and no save it can
        still wait for has begun), :data:`STOP_AT_NEXT_SAVE` (less than a step and :data:`NEAR_MARGIN_S` are left
        and the job's own deadline save will not come first), or :data:`GO_ON`."""
        if self.deadline is None:
            return GO_ON
        stop_at = self.stop_at(setup_done_at)
        if now >= stop_at:
            return GO_ON if save_begun and now < self.cap else STOP
        due = self.job_save_due(setup_done_at)
        if due is not None and due <= stop_at:
            return GO_ON  # the job's own deadline save comes before the stop: a periodic save would cut it short
        return STOP_AT_NEXT_SAVE if stop_at - now <= (mean_step_s or 0.0) + NEAR_MARGIN_S else GO_ON

    def usd_at(self, moment: float) -> float | None:
        """What the run's GPUs had cost at ``moment`` (None: no price)."""
        if self.usd_per_hour is None or self.usd_since is None:
            return None
        return max(0.0, moment - self.usd_since) / 3600.0 * self.usd_per_hour

    def limit_text(self) -> str:
        """The deadline in words: "max_run_usd: the run's 20.00 USD at 88.00 USD/h, at 12:00:00Z"."""
        deadline = self.deadline
        return "no deadline" if deadline is None else f"{deadline.kind}: {deadline.what}"

    def loss(
        self,
        *,
        steps_lost: int,
        lost_since: float,
        stopped_at: float,
        setup_done_at: float | None,
        attempt_started_at: float,
        reserve_s: float | None = None,
    ) -> Loss:
        """The loss of a stop at ``stopped_at`` that left ``steps_lost`` completed steps unsaved since ``lost_since``
        (the newest save, or the attempt's start), with the reason in words."""
        gpu_hours = max(0.0, stopped_at - lost_since) / 3600.0 * self.gpus
        deadline = self.deadline
        what = deadline.what if deadline is not None else "the deadline"
        due = self.job_save_due(setup_done_at)
        if setup_done_at is None:
            why = f"NeMo RL's setup had not ended {stopped_at - attempt_started_at:.0f}s after the submit, at {what}"
        elif due is not None and due > stopped_at:
            took = setup_done_at - attempt_started_at
            reserved = f" ({reserve_s:.0f}s were reserved)" if reserve_s is not None else ""
            why = (
                f"NeMo RL's setup took {took:.0f}s{reserved}, so its deadline save was due {due - stopped_at:.0f}s "
                f"after the stop at {what}"
            )
        else:
            why = f"no save came between the newest one and the stop at {what}"
        hard = self.hard_end
        if deadline is not None and not deadline.hard and self.overrun_s <= 0 and (hard is None or hard != deadline):
            why += "; the deployment allows no overrun to finish a save (budget_overrun_minutes=0)"
        elif deadline is not None and not deadline.hard and stopped_at >= self.cap - 1:
            why += f"; the overrun of {self.overrun_s / 60:.0f} min to finish a save ran out"
        return Loss(steps_lost, gpu_hours, why)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (trigger kwargs: a triggerer restart keeps the same clock)."""
        return {
            "limits": [limit.to_dict() for limit in self.limits],
            "overrun_s": self.overrun_s,
            "usd_per_hour": self.usd_per_hour,
            "usd_since": self.usd_since,
            "gpus": self.gpus,
            "job_save_by_s": self.job_save_by_s,
            "save_margin_s": self.save_margin_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunClock:
        """Rebuild from :meth:`to_dict` (None or empty: no limits)."""
        if not data:
            return cls()
        price, since = data.get("usd_per_hour"), data.get("usd_since")
        return cls(
            tuple(Limit.from_dict(item) for item in data.get("limits") or ()),
            float(data.get("overrun_s") or 0.0),
            None if price is None else float(price),
            None if since is None else float(since),
            int(data.get("gpus") or 0),
            float(data.get("job_save_by_s") or 0.0),
            float(data.get("save_margin_s") or 0.0),
        )
