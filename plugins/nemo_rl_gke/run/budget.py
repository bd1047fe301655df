"""A run's budget: the hours and USD the deployment and the conf allow, what is left, and NeMo RL's deadline.

The deployment sets ``max_run_hours`` and ``max_run_usd`` (:mod:`nemo_rl_gke.run.deployment`); a conf may only lower
them. USD becomes hours through the run report's cost model (:func:`nemo_rl_gke.run.costs.gpu_hour_price` x GPUs per
node x GPU nodes), and the lower limit applies, counted from the run's start: provisioning spends budget too.

Training keeps inside it twice over. The job gets NeMo RL's ``checkpointing.checkpoint_must_save_by``
("DD:HH:MM:SS", both pinned versions have it: ``TimeoutChecker`` in ``nemo_rl/utils/timer.py`` at v0.5.0 and
v0.7.0) from the time left at submit, less a margin for the save, so it saves and exits by itself. NeMo RL starts
that clock when its training loop starts, after the model has loaded, so the trigger also watches the deadline: it
stops the job at its next save once less than a step (and the margin) is left, and at once when it is spent.

Flex-start capacity is a limit of the same kind: GKE removes its nodes ``maxRunDuration`` after they start
(``flex_start_max_hours``, else 7 days), so the run's hours are at most that, counted from the run's start. The
nodes start later than the run, so the job saves and exits before they go, with room to spare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.conf_schema import FLEX_KINDS, FLEX_START_MAX_HOURS
from nemo_rl_gke.run.costs import gpu_hour_price, pool_usd_per_hour
from nemo_rl_gke.run.deployment import Deployment

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# The save NeMo RL makes at its deadline needs time: a tenth of what is left, at most 10 min.
SAVE_MARGIN_S = 600.0
SAVE_MARGIN_SHARE = 0.1


class BudgetSpentError(ValueError):
    """The run's budget was spent before training could start."""


@dataclass(frozen=True)
class RunBudget:
    """The limits that apply to one run. ``hours`` and ``usd`` are the effective ones (each also bounded by the
    other through the cost model); None: no limit (or no price to convert USD with)."""

    hours: float | None
    usd: float | None
    usd_per_hour: float | None
    gpu_nodes: int
    gpu_nodes_limit: int | None

    @property
    def seconds(self) -> float | None:
        """The budget in seconds from the run's start."""
        return None if self.hours is None else self.hours * 3600.0

    def deadline(self, run_started_at: float) -> float | None:
        """Epoch seconds the run must be done by (None: no limit)."""
        return None if self.seconds is None else run_started_at + self.seconds

    def usd_at(self, elapsed_s: float) -> float | None:
        """What the run has spent after ``elapsed_s`` seconds, by the budget's own clock."""
        return None if self.usd_per_hour is None else max(0.0, elapsed_s) / 3600.0 * self.usd_per_hour

    def xcom(self, *, stopped_at_budget: bool) -> dict[str, Any]:
        """The ``budget`` XCom of train.wait (the Training view's figures)."""
        return {
            "hours_limit": None if self.hours is None else round(self.hours, 4),
            "usd_limit": None if self.usd is None else round(self.usd, 2),
            "gpu_nodes": self.gpu_nodes,
            "gpu_nodes_limit": self.gpu_nodes_limit,
            "stopped_at_budget": stopped_at_budget,
        }


def _limit(deployment_value: float, conf_value: float | None) -> float | None:
    """The lower of the deployment's limit (0: none) and the conf's (None: none)."""
    limits = [v for v in (deployment_value if deployment_value > 0 else None, conf_value) if v is not None]
    return float(min(limits)) if limits else None


def run_budget(spec: RunSpec, deployment: Deployment) -> RunBudget:
    """The run's effective budget under ``deployment``."""
    # The conf's gpu_hour_price_usd may raise the price the budget counts with, never lower it below the report's
    # list price: the conf is untrusted, and a tiny price would stretch a USD cap.
    listed, _ = gpu_hour_price(spec.gpu_type)
    price, _ = gpu_hour_price(spec.gpu_type, spec.gpu_hour_price_usd)
    if listed is not None and price is not None:
        price = max(price, listed)
    rate = pool_usd_per_hour(price, spec.gpus_per_node, spec.worker_replicas)
    hours = _limit(deployment.max_run_hours, spec.max_run_hours)
    if spec.capacity in FLEX_KINDS:
        flex_hours = float(spec.flex_start_max_hours or FLEX_START_MAX_HOURS)
        hours = flex_hours if hours is None else min(hours, flex_hours)
    usd = _limit(deployment.max_run_usd, spec.max_run_usd)
    if rate:
        if usd is not None:
            hours = usd / rate if hours is None else min(hours, usd / rate)
        if hours is not None:
            usd = hours * rate if usd is None else min(usd, hours * rate)
    return RunBudget(hours, usd, rate, spec.worker_replicas, deployment.max_gpu_nodes_per_run)


def must_save_by(seconds_left: float) -> str:
    """NeMo RL's ``checkpoint_must_save_by`` ("DD:HH:MM:SS") for a job with ``seconds_left``, less the save margin;
    raises :class:`BudgetSpentError` when nothing is left to train in."""
    usable = seconds_left - min(SAVE_MARGIN_S, SAVE_MARGIN_SHARE * seconds_left)
    if not math.isfinite(usable) or usable < 1:
        raise BudgetSpentError(f"{max(seconds_left, 0.0):.0f}s of the run's budget is left: no time to train")
    total = int(usable)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{seconds:02d}"
