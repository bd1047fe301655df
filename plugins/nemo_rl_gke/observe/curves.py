"""The Training view's curves: bounded, each step computed once, and sent to the page as what changed since its
last poll.

A curve is ``[[n, value], ...]``, ``n`` counting the run's completed steps from 1 (NeMo RL's own step number restarts
each epoch); validation points sit at the step they were printed in.

- **Bounded**: the steps are cut into buckets of ``width`` steps, the smallest power of two that makes at most
  :data:`BUCKETS` of them. Each bucket keeps its lowest and its highest point, in step order, so no peak or dip is
  lost; a curve's first and last point are always kept. At most :data:`MAX_POINTS` points a curve.
- **Each step once**: the steps before the newest :data:`TENTATIVE_STEPS` are firm (a row the trigger saved is
  final once a step follows it); their points, and a bucket once all its steps are firm, are kept per run
  (:class:`RunCurves`), so a poll computes only the newest steps and the open buckets.
- **What changed**: buckets never change once closed, as long as the width stays. Each answer gives the page a token
  (this run's curves' version, the width, the step the closed buckets reach); the page sends it back, and the answer
  carries only the points after that step and says from where (``from``). A page without a token, or with one that
  no longer holds (another width, the steps were re-read), gets every point.
"""

from __future__ import annotations

import itertools
import math
import re
import secrets
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics

# The most points a curve sends to the page: a week-long run's poll costs what an hour's does.
MAX_POINTS = 2000
# Two points a bucket, and a curve's first and last point.
BUCKETS = MAX_POINTS // 2 - 1
# The newest steps are still being written (a step's validation lines follow its results): computed at every poll.
TENTATIVE_STEPS = 2
# The curves the page draws: (key, title, unit).
CURVES: tuple[tuple[str, str, str], ...] = (
    ("reward", "Average reward", ""),
    ("loss", "Loss", ""),
    ("throughput", "E2E throughput", "tokens/s/GPU"),
    ("validation", "Validation accuracy", ""),
)
KEYS = tuple(key for key, _, _ in CURVES)
Points = list[list[float]]
# A token names this process too: another API server worker, or this one restarted, holds other curves.
_PROCESS = secrets.token_hex(4)
_VERSIONS = itertools.count(1)


def _round(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None  # JSON has no NaN, and a curve cannot draw it
    return round(float(value), 6)


def _throughput(step: StepMetrics) -> float | None:
    if step.e2e_tokens_per_s_per_gpu is not None:
        return step.e2e_tokens_per_s_per_gpu
    return step.group_tokens_per_s.get("E2E")


VALUES: dict[str, Callable[[StepMetrics], float | None]] = {
    "reward": lambda s: s.avg_reward,
    "loss": lambda s: s.loss,
    "throughput": _throughput,
}


def width_for(steps: int) -> int:
    """The bucket width for a run of ``steps`` completed steps: the smallest power of two that makes at most
    :data:`BUCKETS` buckets."""
    width = 1
    while steps > width * BUCKETS:
        width *= 2
    return width


def _add(points: dict[str, Points], step: StepMetrics, n: int) -> int:
    """Add one step's points (``n``: completed steps before it); the completed count after it."""
    if step.completed:
        n += 1
        for key, get in VALUES.items():
            value = _round(get(step))
            if value is not None:
                points[key].append([n, value])
    if step.val_accuracy is not None:
        points["validation"].append([n, _round(step.val_accuracy) or 0.0])
    return n


def _buckets(points: Sequence[list[float]], width: int, *, first: bool, last: bool) -> Points:
    """Each bucket's lowest and highest point of ``points`` (in step order), plus the first point when ``first``
    and the last when ``last``."""
    kept: Points = []
    start = 0
    while start < len(points):
        bucket = (int(points[start][0]) - 1) // width
        end = start
        while end < len(points) and (int(points[end][0]) - 1) // width == bucket:
            end += 1
        run = range(start, end)
        chosen = {min(run, key=lambda i: points[i][1]), max(run, key=lambda i: points[i][1])}
        if first and start == 0:
            chosen.add(0)
        if last and end == len(points):
            chosen.add(end - 1)
        kept += [points[i] for i in sorted(chosen)]
        start = end
    return kept


def _after(points: Points, x: float) -> int:
    """The index of the first point past step ``x``."""
    return bisect_right(points, x, key=lambda p: p[0])


@dataclass
class RunCurves:
    """One run's curves as far as its steps are firm: their points, and the buckets they close, at one width."""

    layout: tuple[Any, ...] = ()
    firm_index: int = 0  # the job's steps taken as final
    firm_n: int = 0  # completed steps among them
    probe: dict[str, Any] | None = None  # the last firm step, to see that the steps before are still the same
    points: dict[str, Points] = field(default_factory=lambda: {key: [] for key in KEYS})
    width: int = 1
    kept: dict[str, Points] = field(default_factory=lambda: {key: [] for key in KEYS})
    closed_x: int = 0  # the buckets up to this step are in ``kept``
    # Changes whenever the kept buckets start over, so a page's token from before never matches.
    version: str = field(default_factory=lambda: f"{_PROCESS}-{next(_VERSIONS)}")
    # Held while a poll updates and reads them (the API server answers polls in a thread pool).
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def update(self, metrics: RunMetrics, layout: tuple[Any, ...] = ()) -> tuple[int, dict[str, Points]]:
        """Take the run's steps: the firm ones once, the newest at every call. Returns the completed steps in all
        and the points of the tentative steps."""
        steps = metrics.steps
        if (
            layout != self.layout
            or len(steps) < self.firm_index
            or (self.firm_index and steps[self.firm_index - 1].to_dict() != self.probe)
        ):
            self._start_over(layout)
        firm = max(self.firm_index, len(steps) - TENTATIVE_STEPS)
        n = self.firm_n
        for step in steps[self.firm_index : firm]:
            n = _add(self.points, step, n)
        if firm > self.firm_index:
            self.firm_index, self.firm_n, self.probe = firm, n, steps[firm - 1].to_dict()
        tail: dict[str, Points] = {key: [] for key in KEYS}
        for step in steps[firm:]:
            n = _add(tail, step, n)
        return n, tail

    def _start_over(self, layout: tuple[Any, ...]) -> None:
        fresh = RunCurves(layout)
        for name in ("layout", "firm_index", "firm_n", "probe", "points", "width", "kept", "closed_x", "version"):
            setattr(self, name, getattr(fresh, name))

    def window(
        self, completed: int, tail: dict[str, Points], since: str = ""
    ) -> tuple[dict[str, Points], dict[str, Any]]:
        """The bounded curves, and what to send with them: ``from`` (the step after which they start: 0 for whole
        curves, else the step the page's closed buckets reach, when ``since`` is the token this gave the page and
        still holds), ``token`` (what the page sends back) and ``shown`` (each curve's points in all)."""
        wanted = width_for(completed)
        if wanted != self.width:
            self.width, self.kept, self.closed_x = wanted, {key: [] for key in KEYS}, 0
        closable = (self.firm_n // wanted) * wanted
        if closable > self.closed_x:
            for key, points in self.points.items():
                begin, end = _after(points, self.closed_x), _after(points, closable)
                self.kept[key] += _buckets(points[begin:end], wanted, first=begin == 0, last=False)
            self.closed_x = closable
        upto = _upto(since, f"{self.version}.{wanted}.")
        start = upto if upto is not None and upto <= self.closed_x else 0
        out: dict[str, Points] = {}
        shown: dict[str, int] = {}
        for key in KEYS:
            rest = self.points[key][_after(self.points[key], self.closed_x) :] + tail[key]
            kept = self.kept[key]
            open_part = _buckets(rest, wanted, first=not kept, last=True)
            out[key] = kept[_after(kept, start) :] + open_part
            shown[key] = len(kept) + len(open_part)
        return out, {"from": start, "token": f"{self.version}.{wanted}.{self.closed_x}", "shown": shown}


def _upto(since: str, prefix: str) -> int | None:
    """The step in a token of ``prefix`` (this run's version and width), or None for any other token."""
    # The page's token is untrusted input: ASCII digits only (str.isdigit would take '²', which int() refuses).
    if len(since) > 64 or not since.startswith(prefix) or not re.fullmatch(r"[0-9]{1,18}", since[len(prefix) :]):
        return None
    return int(since[len(prefix) :])


def series(metrics: RunMetrics) -> dict[str, Points]:
    """Every curve of ``metrics``, whole and bounded (no cache): what a first poll gets."""
    curves = RunCurves()
    completed, tail = curves.update(metrics)
    return curves.window(completed, tail)[0]


class CurveCache:
    """The runs' :class:`RunCurves`, for the runs polled last."""

    def __init__(self, runs: int = 32) -> None:
        self._runs: OrderedDict[tuple[str, str], RunCurves] = OrderedDict()
        self._limit = runs

    def get(self, dag_id: str, run_id: str) -> RunCurves:
        """The run's curves (new for a run not polled lately)."""
        curves = self._runs.pop((dag_id, run_id), None) or RunCurves()
        self._runs[(dag_id, run_id)] = curves
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)
        return curves
