"""A run's budget: the hours and USD the deployment and the conf allow, and the clock every stop of its job reads.

The deployment sets ``max_run_hours`` and ``max_run_usd`` (:mod:`nemo_rl_gke.run.deployment`); a conf may only lower
them. USD is counted the run report's way: the served capacity's price per GPU-hour
(:func:`nemo_rl_gke.run.costs.gpu_hour_price`, which a conf may raise, never lower) x GPUs, from when the GPU pool came
up. Hours are counted from the run's start: provisioning spends them too. Flex-start capacity is a limit of the same
kind: GKE removes its nodes ``maxRunDuration`` after they start (``flex_start_max_hours``, else 7 days).

:func:`run_clock` turns these limits and the job timeout into one :class:`~nemo_rl_gke.run.deadline.RunClock`: the
submit derives NeMo RL's ``checkpointing.checkpoint_must_save_by`` from it, the trigger its hard stop
(:mod:`nemo_rl_gke.run.deadline` says how the two account for the job's setup).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.conf_schema import FLEX_KINDS, FLEX_START_MAX_HOURS
from nemo_rl_gke.run.costs import gpu_hour_price, pool_usd_per_hour
from nemo_rl_gke.run.deadline import CAPACITY_END, HOURS, JOB_TIMEOUT, USD, Limit, RunClock
from nemo_rl_gke.run.deployment import Deployment

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec


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


def pool_rate(spec: RunSpec) -> float | None:
    """USD per hour of the run's GPU nodes at the one price (its ``capacity``'s; after the ladder, the served one's)."""
    price, _ = gpu_hour_price(spec.gpu_type, spec.gpu_hour_price_usd, spec.capacity)
    return pool_usd_per_hour(price, spec.gpus_per_node, spec.worker_replicas)


def flex_hours(spec: RunSpec) -> float | None:
    """How long flex-start (or queued) nodes may run (None: the capacity has no such end)."""
    return float(spec.flex_start_max_hours or FLEX_START_MAX_HOURS) if spec.capacity in FLEX_KINDS else None


def run_budget(spec: RunSpec, deployment: Deployment) -> RunBudget:
    """The run's effective budget under ``deployment``."""
    rate = pool_rate(spec)
    hours = _limit(deployment.max_run_hours, spec.max_run_hours)
    flex = flex_hours(spec)
    if flex is not None:
        hours = flex if hours is None else min(hours, flex)
    usd = _limit(deployment.max_run_usd, spec.max_run_usd)
    if rate:
        if usd is not None:
            hours = usd / rate if hours is None else min(hours, usd / rate)
        if hours is not None:
            usd = hours * rate if usd is None else min(usd, hours * rate)
    return RunBudget(hours, usd, rate, spec.worker_replicas, deployment.max_gpu_nodes_per_run)


def run_clock(
    spec: RunSpec,
    deployment: Deployment,
    *,
    run_started_at: float,
    pool_ready_at: float | None = None,
    served_started_at: float | None = None,
    submitted_at: float | None = None,
) -> RunClock:
    """Every limit of the run as one clock. ``pool_ready_at``: when the GPU pool came up (the USD clock's start; None:
    the run's start); ``served_started_at``: when the served rung's wait began (its nodes start after it; None: the
    run's start); ``submitted_at``: the job's first submission (None: no job timeout yet)."""
    rate = pool_rate(spec)
    usd_since = pool_ready_at if pool_ready_at is not None else run_started_at
    limits = []
    hours = _limit(deployment.max_run_hours, spec.max_run_hours)
    if hours is not None:
        limits.append(
            Limit(HOURS, run_started_at + hours * 3600.0, False, f"the run's {hours:g} h budget (max_run_hours)")
        )
    usd = _limit(deployment.max_run_usd, spec.max_run_usd)
    if usd is not None and rate:
        what = f"the run's {usd:,.2f} USD budget (max_run_usd, {spec.capacity} at {rate:,.2f} USD/h)"
        limits.append(Limit(USD, usd_since + usd / rate * 3600.0, False, what))
    flex = flex_hours(spec)
    if flex is not None:
        start = served_started_at if served_started_at is not None else run_started_at
        what = f"the {spec.capacity} nodes' end ({flex:g} h, flex_start_max_hours)"
        limits.append(Limit(CAPACITY_END, start + flex * 3600.0, True, what))
    if submitted_at is not None:
        what = f"the job timeout ({spec.job_timeout_s:,} s, job_timeout_s)"
        limits.append(Limit(JOB_TIMEOUT, submitted_at + float(spec.job_timeout_s), False, what))
    return RunClock(
        tuple(limits),
        overrun_s=deployment.budget_overrun_minutes * 60.0,
        usd_per_hour=rate,
        usd_since=usd_since,
        gpus=spec.worker_replicas * spec.gpus_per_node,
    )
