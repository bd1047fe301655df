"""The trigger that follows the GRPO Ray job: status, live driver log, step metrics, zero-learning guard, timeout.

It polls the Jobs REST API (``GET /api/jobs/{id}``) through the async Ray Jobs hook (aiohttp only), reads the driver
log where it is new (Ray's ``/logs/tail`` websocket, or whole ``/logs`` downloads where no websocket gets through:
:meth:`~nemo_rl_gke.ray.async_hooks.RayJobsAsyncHook.logs`), writes each
new driver-log line into the task log as it arrives (vLLM progress bars collapsed), parses NeMo RL's step metrics,
and ends with exactly one event, small whatever the job's length (Airflow logs it as one line)::

    {"status": "success" | "failed" | "stopped" | "zero_learning" | "converged" | "budget" | "stalled" | "timeout"
               | "error",
     "message": str, "submission_id": str, "job_status": str, "summary": RunMetrics.summary(),
     "final_step": last checkpoint saved | None, "guard": {"kind", "decided_at", "k"} | None,
     "tail": [last driver-log lines]}

The per-step table is not in it: the sensor reads it from the job's log when it resumes. The guard stops a job
that never learned (or collapsed) at once; a job that converged runs to its next checkpoint save and is stopped
then ("converged", a success). The run's clock (``clock``: every limit of the run, :mod:`nemo_rl_gke.run.deadline`)
stops the job at its next save once less than a step is left before the stop it sets, at that stop otherwise, and a
job that stopped itself at NeMo RL's ``checkpoint_must_save_by`` is one too ("budget", a success: the newest save is
exported; the event's ``stop`` says which limit, the USD spent then and what was lost). The stop waits for the job's
own deadline save when NeMo RL's clock (started at its ``SETUP COMPLETE``, which the trigger reads) puts it after the
deadline, within the deployment's overrun, and for a save already begun. A job that prints no new
step for the stall bound (:func:`~nemo_rl_gke.observe.step_timing.stall_after`) is stopped ("stalled": its newest
finished save is exported, then the run fails). The timeout stops the job before the event is sent. Marking the deferred
task failed or success in the UI (or clearing it) calls :meth:`on_kill`, which stops the job too. The Google token for
the API server's service proxy is fetched here, never passed in: trigger kwargs are stored in the metadata DB.

Every deferred task shares the triggerer's event loop, so the per-poll work on the driver log (it can be megabytes:
decoding, redacting, splitting, parsing, logging) runs in a worker thread; what stays on the loop is HTTP and
bounded bookkeeping. The job's secrets are masked by a :class:`~nemo_rl_gke.observe.redaction.StreamRedactor` before the
log is split into lines, so no line break, chunk boundary or display cut can show part of one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nemo_rl_gke.airflow_compat import get_async_connection
from nemo_rl_gke.decide import job_stop
from nemo_rl_gke.decide.job_stop import TERMINAL
from nemo_rl_gke.kube.errors import KubeApiError, is_kube_transient
from nemo_rl_gke.observe import driver_log, step_store
from nemo_rl_gke.observe.metrics import LogFollower, newest_save, save_in_progress, saved_after
from nemo_rl_gke.observe.redaction import StreamRedactor
from nemo_rl_gke.observe.report import budget_stop_text
from nemo_rl_gke.observe.step_timing import mean_step_time, progress_mark, stall_after
from nemo_rl_gke.observe.zero_learning import ZeroLearningVerdict, check_zero_learning
from nemo_rl_gke.ray.errors import RayJobsApiError, RayJobsTransientError, RayTlsError
from nemo_rl_gke.run.deadline import STOP_AT_NEXT_SAVE, Limit, RunClock
from nemo_rl_gke.triggers.clients import RAY, client_module
from nemo_rl_gke.triggers.log_position import LogPositions
from nemo_rl_gke.triggers.metrics_store import MetricsStore
from nemo_rl_gke.triggers.operations import backoff_delay, long_wait_delay

if TYPE_CHECKING:
    from nemo_rl_gke.ray.async_hooks import RayJobsAsyncHook

CLASSPATH = "nemo_rl_gke.triggers.rayjob.RayJobTrigger"
TAIL_LINES = 30
# The event is logged as one line, and its tail ends up in the task's failure message: both stay under 8 KB (UTF-8).
TAIL_MAX_BYTES = 2500
TAIL_LINE_MAX_BYTES = 300
MESSAGE_MAX_BYTES = 2500
STOP_TIMEOUT_S = 30.0
RAY_TOKEN_ATTEMPTS = 4
# The limit of a trigger serialized before the run's clock: its one budget deadline, whichever limit made it.
LEGACY_BUDGET = "budget"
# Between step metrics, where the task log stopped is saved at most this often: what a restarted trigger may repeat.
POSITION_SAVE_S = 30.0
# The start of a step's header line (NeMo RL's "===== Step k/K =====", after any Ray prefix): a read is logged in
# pieces that end there, each followed by its position save, so a trigger killed mid-read repeats one step at most.
_STEP_LINE_RE = re.compile(r"^[^\n]*?=+[ \t]*Step[ \t]+\d+[ \t]*/", re.M)


class RayJobTrigger(BaseTrigger):
    """Follows one Ray job until it ends, the guard stops it, or the deadline passes; yields one event.

    :param address: the Ray dashboard base URL (the service-proxy path, or the conf's direct URL).
    :param submission_id: the job.
    :param needs_token: send the Google bearer token of ``gcp_conn_id`` (only through the API server).
    :param gcp_conn_id: the connection the token comes from.
    :param poll_interval: seconds between polls.
    :param timeout: seconds from ``started_at`` until the job is stopped and a ``timeout`` event sent.
    :param started_at: epoch seconds the job was submitted (serialized, so the deadline survives restarts).
    :param zero_learning_steps: K for the guard; 0 switches the guard off.
    :param secret_conn_ids: connections whose passwords the job has as env vars (ids only, never values): a job
        that prints one gets it replaced by ``***`` in the task log and the event, since the triggerer is not the
        process that masked it at submit time.
    :param ca_pem: the CA that signs an https ``address`` (the GKE API server's own); empty: the system's CAs.
    :param cluster_path: the GKE cluster (``projects/P/locations/L/clusters/C``) whose API holds the Ray token.
    :param log_stream: read the log through Ray's tail websocket (each byte once); False: download the whole log
        every poll, as for a proxy that passes no websocket upgrade (the trigger falls back to it by itself too).
    :param ray_token_secret: the API path of KubeRay's Secret with the Ray token (empty: the RayCluster has no token
        auth). The token is read in ``run`` and sent as ``X-Ray-Authorization``; like the Google token, it is never
        a kwarg, and it is masked in everything the trigger logs or sends.
    :param clock: the run's :class:`~nemo_rl_gke.run.deadline.RunClock` as a dict (its limits, the overrun, the price
        and what the job was given); None: the legacy ``budget_deadline`` alone (a trigger serialized before the clock).
    :param budget_deadline: (legacy) epoch seconds the run's budget ends (0: no budget), used without ``clock``.
    :param run_started_at: epoch seconds the run started (0: ``started_at``).
    :param usd_per_hour: (legacy) the run's GPU cost per hour (0: unknown), used without ``clock``.
    :param max_steps: the steps the job was to train, for the budget message.
    :param stall_after_s: seconds without a new step that make a stall; 0: derived from the step times.
    :param attempt_started_at: epoch seconds this attempt of the job was submitted (a recovery's resubmission; 0:
        ``started_at``): the stall clock starts there, while the job timeout counts from the first submission.
    :param task_key: the deferred task instance (``dag_id``, ``run_id``, ``task_id``, ``map_index``) whose XCom
        keeps where the task log stopped (:mod:`~nemo_rl_gke.triggers.log_position`): a trigger run again after a
        triggerer restart logs only the lines after it. None: every trigger logs the job's lines from the start.
    """

    def __init__(
        self,
        address: str,
        submission_id: str,
        *,
        needs_token: bool = False,
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 15.0,
        timeout: float = 86400.0,
        started_at: float | None = None,
        zero_learning_steps: int = 3,
        secret_conn_ids: Sequence[str] = (),
        ca_pem: str = "",
        cluster_path: str = "",
        ray_token_secret: str = "",
        log_stream: bool = True,
        budget_deadline: float = 0.0,
        run_started_at: float = 0.0,
        usd_per_hour: float = 0.0,
        max_steps: int = 0,
        stall_after_s: float = 0.0,
        attempt_started_at: float = 0.0,
        task_key: Mapping[str, Any] | None = None,
        clock: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.address = address.rstrip("/")
        self.submission_id = submission_id
        self.needs_token = needs_token
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()
        self.zero_learning_steps = int(zero_learning_steps)
        self.secret_conn_ids = list(secret_conn_ids)
        self.ca_pem = ca_pem
        self.cluster_path = cluster_path
        self.ray_token_secret = ray_token_secret
        self.log_stream = bool(log_stream)
        # The HTTP side, built from these kwargs when the trigger runs (_ray_hook): the tokens are fetched then,
        # never passed in, and its client module is imported off the event loop.
        self._hook: RayJobsAsyncHook | None = None
        self._converged_logged = False
        self.budget_deadline = float(budget_deadline)
        self.run_started_at = float(run_started_at) or self.started_at
        self.usd_per_hour = float(usd_per_hour)
        self.clock_data = dict(clock) if clock else None
        self.clock = RunClock.from_dict(self.clock_data) if self.clock_data else self._legacy_clock()
        # When this trigger saw NeMo RL's setup end (its deadline clock start), the newest finished save and when
        # it was seen, and whether the late deadline save was announced.
        self._setup_done_at: float | None = None
        self._newest: tuple[int | None, float] = (None, 0.0)
        self._late_said = False
        self._overrun_said = False
        self.max_steps = int(max_steps)
        self.stall_after_s = float(stall_after_s)
        # The step the budget came near in (its save is awaited), and when the log last showed progress.
        self._budget_near_index: int | None = None
        self._progress = (0, 0, 0)
        # When the job's status is next asked of Ray, and its details as last answered (_status_when_due).
        self._status_due = 0.0
        self._status_info: dict[str, Any] = {}
        self.attempt_started_at = float(attempt_started_at)
        self._progress_at = self.attempt_started_at or self.started_at
        self.task_key = dict(task_key) if task_key else None
        self._positions = LogPositions(self.task_key) if self.task_key else None
        # The step store (observe/step_store.py): the rows saved so far, so each save writes only the newest chunk.
        self._store = MetricsStore(self.task_key) if self.task_key else None
        self._store_rows = 0
        self._store_saved = (0, -1)
        # The log characters a trigger before this one had written into the task log (read, not logged again), and
        # what the last saved position was taken at.
        self._logged_until = 0
        self._saved = (0, (0, False, 0), 0.0)
        # Replaced once the secret values are loaded in run(): values never reach __init__, kwargs or the DB.
        self._redactor = StreamRedactor(())
        self.follower = LogFollower(redactor=self._redactor)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and the kwargs ``__init__`` takes (no token: it is fetched in ``run``)."""
        return (
            CLASSPATH,
            {
                "address": self.address,
                "submission_id": self.submission_id,
                "needs_token": self.needs_token,
                "gcp_conn_id": self.gcp_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "started_at": self.started_at,
                "zero_learning_steps": self.zero_learning_steps,
                "secret_conn_ids": self.secret_conn_ids,
                "ca_pem": self.ca_pem,
                "cluster_path": self.cluster_path,
                "ray_token_secret": self.ray_token_secret,
                "log_stream": self.log_stream,
                "budget_deadline": self.budget_deadline,
                "run_started_at": self.run_started_at,
                "usd_per_hour": self.usd_per_hour,
                "max_steps": self.max_steps,
                "stall_after_s": self.stall_after_s,
                "attempt_started_at": self.attempt_started_at,
                "task_key": self.task_key,
                "clock": self.clock_data,
            },
        )

    def _legacy_clock(self) -> RunClock:
        """The clock of a trigger serialized before the clock existed: its budget deadline alone (whichever limit
        made it), no overrun, its price counted from the run's start as it was then."""
        limits = (
            (Limit(LEGACY_BUDGET, self.budget_deadline, False, "the run's budget"),) if self.budget_deadline else ()
        )
        return RunClock(limits, usd_per_hour=self.usd_per_hour or None, usd_since=self.run_started_at)

    # --- secrets ----------------------------------------------------------------------------------------------------
    async def _load_secrets(self) -> None:
        """Build the redactor from the job's secret values and the Ray token (the async connection API also
        registers the passwords with the masker); the follower gets it before it reads any log text."""
        await self._ray_hook()
        values: list[str] = []
        if self.ray_token_secret:
            values.append(await self._ray_token())
        for conn_id in self.secret_conn_ids:
            try:
                password = (await get_async_connection(conn_id)).password
            except Exception:
                password = None  # the submit task refused a missing one already
            if password:
                values.append(password)
        self._redactor = StreamRedactor(values)
        self.follower = LogFollower(redactor=self._redactor)

    async def _ray_token(self) -> str:
        """The Ray token from KubeRay's Secret, read by the hook, which sends it from then on (transient errors
        retried a few times; raises RayTokenMissingError or KubeApiError)."""
        for attempt in range(1, RAY_TOKEN_ATTEMPTS + 1):
            try:
                return await self._ray.read_ray_token()
            except KubeApiError as exc:
                if attempt == RAY_TOKEN_ATTEMPTS or not is_kube_transient(exc):
                    raise
                await asyncio.sleep(backoff_delay(attempt, self.poll_interval))
        raise AssertionError("unreachable")

    async def _ray_hook(self) -> RayJobsAsyncHook:
        """The Ray Jobs hook, built on first use (its module imported in a worker thread)."""
        if self._hook is None:
            hooks = await client_module(RAY)
            self._hook = hooks.RayJobsAsyncHook(
                self.address,
                needs_token=self.needs_token,
                gcp_conn_id=self.gcp_conn_id,
                ca_pem=self.ca_pem,
                cluster_path=self.cluster_path,
                ray_token_secret=self.ray_token_secret,
                log_stream=self.log_stream,
            )
        return self._hook

    @property
    def _ray(self) -> RayJobsAsyncHook:
        """The hook, once :meth:`_ray_hook` built it (every path that talks to Ray starts there)."""
        if self._hook is None:
            raise RuntimeError("the Ray Jobs hook is built when the trigger runs (await _ray_hook() first)")
        return self._hook

    @property
    def bytes_fetched(self) -> int:
        """Log bytes fetched so far, by the stream and by whole-log downloads (what bench/log_follow.py measures)."""
        return self._hook.bytes_fetched if self._hook is not None else 0

    # --- the log ----------------------------------------------------------------------------------------------------
    async def _read_log(self, terminal: bool) -> tuple[ZeroLearningVerdict | None, int | None]:
        """Read what is new in the log (from the follower's offset on) and judge it in a worker thread. For a
        terminal job the hook reads the log to its end."""
        read = await self._ray.logs(self.submission_id, self.follower.offset, to_end=terminal)
        if read.fallback:
            self.log.warning("Ray job %s: following its log by whole downloads (%s)", self.submission_id, read.fallback)
            self.log_stream = False
        return await asyncio.to_thread(self._take_logs, read.text, read.start)

    def _take_logs(self, text: str | None, start: int | None) -> tuple[ZeroLearningVerdict | None, int | None]:
        """Feed log text to the follower, log the new lines, and check the guard. Runs in a worker thread.

        ``text`` starts at character ``start`` of the log, or is the whole log (``start`` None). Returns the guard's
        verdict and, for a converged run, the checkpoint saved since it converged (None until that save has
        finished). Both are derived from everything read so far, so a restarted triggerer decides the same. The
        lines are redacted already (the follower redacts before it splits).
        """
        if text is not None:
            for lines, end, at_step in self._pieces(text, start):
                if end > self._logged_until:
                    self._log_lines(lines)
                    self._save_position()
                if at_step:
                    self._save_store()
        if self.zero_learning_steps <= 0:
            return None, None
        steps = self.follower.metrics.steps
        verdict = check_zero_learning(steps, self.zero_learning_steps)
        if verdict is None or verdict.stops_now:
            return verdict, None
        return verdict, saved_after(steps, verdict.decided_index)

    def _pieces(self, text: str, start: int | None) -> Iterator[tuple[list[str], int, bool]]:
        """Feed a read to the follower in pieces; yield each piece's lines, where in the log it ends and whether a
        step header comes next, before the next piece is fed (the follower's offset is then the piece's end).

        The pieces end before each step's header and at :attr:`_logged_until` (what a trigger before this one had
        logged: read for the metrics and the guards, never logged again), so a piece's lines are all on one side of
        it and each step's lines can be saved as logged before the next step's are written.
        """
        base = 0 if start is None else start
        # A replaced (shorter) whole log is read whole again: feed_full_log resets on its first, shorter, piece.
        replaced = start is None and len(text) < self.follower.offset
        skip = 0 if replaced else max(0, self.follower.offset - base)
        headers = {m.start() for m in _STEP_LINE_RE.finditer(text, skip)}
        cuts = headers | {len(text)}
        if skip < self._logged_until - base < len(text):
            cuts.add(self._logged_until - base)
        previous = skip
        for cut in sorted(c for c in cuts if c > skip):
            if start is None:
                lines = self.follower.feed_full_log(text[:cut])
            else:
                lines = self.follower.feed_at(text[previous:cut], start + previous)
            yield lines, base + cut, cut in headers
            previous = cut

    def _save_position(self) -> None:
        """Record how far the task log has the job's lines, whenever the step metrics moved (so no step's lines are
        logged twice after a restart) and otherwise every POSITION_SAVE_S while lines arrive. A blocking SDK call:
        this runs in the worker thread that logged them."""
        if self._positions is None or self.follower.offset <= max(self._saved[0], self._logged_until):
            return
        metrics = self.follower.metrics
        current = metrics.current
        moved = (len(metrics.steps), current is not None and current.avg_reward is not None, len(metrics.checkpoints))
        now = time.monotonic()
        if moved == self._saved[1] and now - self._saved[2] < POSITION_SAVE_S:
            return
        step = current.step if current is not None else 0
        self._positions.save(self.submission_id, self.follower.offset, step, self.follower.lines_emitted)
        self._saved = (self.follower.offset, moved, now)

    def _save_store(self, *, final: bool = False) -> None:
        """Save the step rows parsed since the last save, and the head that commits them, at a step boundary (the
        next step's header is next, nothing is half parsed) or at the log's end (``final``). A blocking SDK call:
        this runs in the worker thread that parsed them."""
        follower = self.follower
        if self._store is None or not (final or follower.at_line_start):
            return
        metrics = follower.metrics
        mark = (len(metrics.steps), len(metrics.completed_steps) if final else -1)
        if mark == self._store_saved or (not final and len(metrics.steps) <= self._store_rows):
            return
        head, chunks = step_store.snapshot(
            metrics,
            submission_id=self.submission_id,
            offset=follower.offset,
            lines=follower.lines_emitted,
            tail=follower.tail(step_store.TAIL_LINES),
            saved_rows=self._store_rows,
            extra={"setup_done_at": self._setup_done_at, "final": final},
        )
        if self._store.save(head, chunks):
            self._store_rows, self._store_saved = len(metrics.steps), mark

    def _log_lines(self, lines: list[str]) -> None:
        """Write driver-log lines into the task log. Runs in a worker thread (they can be many): asyncio.to_thread
        copies the context the triggerer binds the task's log to."""
        for line in lines:
            self.log.info("%s", driver_log.job_line(line))

    def _flush_logs(self) -> None:
        """End of the log: the held-back text, the unterminated line and unfinished bars, and the step store's last
        save. Runs in a worker thread."""
        self._log_lines(self.follower.flush())
        self._save_store(final=True)

    async def _stop(self) -> str:
        try:
            stopped = await asyncio.wait_for(self._ray.stop(self.submission_id), STOP_TIMEOUT_S)
        except RayJobsApiError as exc:
            return f"the stop request answered {exc}"
        except (RayJobsTransientError, RayTlsError, TimeoutError) as exc:
            return (
                f"stopping it failed ({type(exc).__name__}: {exc}); stop it by hand: ray job stop {self.submission_id}"
            )
        return "the job was stopped" if stopped else "the stop request answered HTTP 200: it was not running"

    # --- events -----------------------------------------------------------------------------------------------------
    async def _event(
        self,
        status: str,
        message: str,
        job_status: str,
        verdict: ZeroLearningVerdict | None = None,
        final_step: int | None = None,
        *,
        stop: Mapping[str, Any] | None = None,
    ) -> TriggerEvent:
        """The one event, built in a worker thread (the summary walks every parsed step)."""
        return await asyncio.to_thread(self._build_event, status, message, job_status, verdict, final_step, stop=stop)

    def _build_event(
        self,
        status: str,
        message: str,
        job_status: str,
        verdict: ZeroLearningVerdict | None,
        final_step: int | None,
        *,
        stop: Mapping[str, Any] | None = None,
    ) -> TriggerEvent:
        # Ray's message (with the job's last log lines in it) is masked here; the tail and summary were built from
        # masked text and are masked again only as a second line of defence.
        redact = self._redactor
        metrics = self.follower.metrics
        checkpoints = metrics.checkpoints
        return TriggerEvent(
            {
                "status": status,
                "message": _clip(redact.redact(message), MESSAGE_MAX_BYTES),
                "submission_id": self.submission_id,
                "job_status": _clip(redact.redact(job_status), 100),
                "summary": redact.redact_value(metrics.summary()),
                "final_step": final_step if final_step is not None else (checkpoints[-1] if checkpoints else None),
                "guard": (
                    {"kind": verdict.kind, "decided_at": verdict.decided_at, "k": verdict.k} if verdict else None
                ),
                "tail": _bounded_tail([redact.redact(line) for line in self.follower.tail(TAIL_LINES)]),
                "stop": redact.redact_value(dict(stop)) if stop else None,
                # Seconds from this attempt's submit to NeMo RL's setup end, as this trigger saw it (None: not seen).
                "startup_s": (
                    None
                    if self._setup_done_at is None
                    else round(self._setup_done_at - (self.attempt_started_at or self.started_at), 1)
                ),
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Follow the job; every exception becomes an ``error`` event (the job keeps running: a retry resumes it)."""
        try:
            event = await self._poll()
        except Exception as exc:
            self.log.exception("Unexpected error while following Ray job %s", self.submission_id)
            try:
                event = await self._event("error", f"following Ray job {self.submission_id} failed: {exc!r}", "UNKNOWN")
            except Exception:
                # Still one event: without the tail, the metrics and the exception's text (nothing left to mask it).
                event = TriggerEvent(
                    {
                        "status": "error",
                        "message": f"following Ray job {self.submission_id} failed: {type(exc).__name__}",
                        "submission_id": self.submission_id,
                        "job_status": "UNKNOWN",
                        "summary": {},
                        "final_step": None,
                        "guard": None,
                        "tail": [],
                    }
                )
        yield event

    async def _start_following(self) -> None:
        """Log the line the job's lines follow, after reading where a trigger before this one left the task log and
        its step store: the metrics it saved are taken as they are, and the log is read on from where they end."""
        if self._store is not None:
            loaded = await asyncio.to_thread(self._store.load, self.submission_id)
            if loaded is not None:
                head, metrics = loaded
                self.follower.resume(metrics, head["offset"], int(head.get("lines") or 0), head.get("tail") or ())
                self._store_rows, self._store_saved = len(metrics.steps), (len(metrics.steps), -1)
                done_at = head.get("setup_done_at")
                self._setup_done_at = float(done_at) if isinstance(done_at, int | float) else None
        if self._positions is not None:
            self._logged_until = await asyncio.to_thread(self._positions.load, self.submission_id)
        self._logged_until = max(self._logged_until, self.follower.offset)
        # With a position, the view reads this job's lines on from there instead of starting them again.
        self.log.info("%s", driver_log.following_line(self.submission_id, self._logged_until))

    async def _poll(self) -> TriggerEvent:
        failures, job_status, info = 0, "UNKNOWN", {}
        await self._load_secrets()
        await self._start_following()
        async with self._ray:
            while True:
                verdict: ZeroLearningVerdict | None = None
                saved: int | None = None
                try:
                    found = await self._status_when_due(time.time())
                    if found is None:
                        return await self._event("error", f"Ray job {self.submission_id} does not exist", job_status)
                    info, job_status = found, str(found.get("status", "UNKNOWN"))
                    verdict, saved = await self._read_log(terminal=job_status in TERMINAL)
                    self._observe(time.time())
                    failures = 0
                except RayJobsApiError as exc:
                    return await self._event("error", f"reading Ray job {self.submission_id}: {exc}", job_status)
                except RayTlsError as exc:
                    # A wrong CA, or a server that is not the cluster's: waiting cannot fix it.
                    return await self._event("error", str(exc), job_status)
                except RayJobsTransientError as exc:
                    failures += 1
                    self._status_due = time.time() + backoff_delay(failures, self.poll_interval)
                    self.log.warning(
                        "Transient error %d polling Ray job %s: %s",
                        failures,
                        self.submission_id,
                        self._redactor.redact(str(exc)),
                    )
                if job_status in TERMINAL:
                    await asyncio.to_thread(self._flush_logs)
                now = time.time()
                reading = self._reading(now, job_status, verdict, saved)
                decision = job_stop.decide(reading)
                if decision is not None:
                    return await self._act(decision, now, reading, info, verdict)
                remaining = reading.job_time_left_s
                wait = self._status_due - time.time()
                if self._ray.stream_state(self.submission_id) == "live":
                    wait = min(wait, self.poll_interval)  # the pushed log is read at the poll interval
                await asyncio.sleep(max(0.0, min(wait, remaining)))

    def _reading(
        self, now: float, job_status: str, verdict: ZeroLearningVerdict | None, saved: int | None
    ) -> job_stop.Reading:
        """What this poll read, for :func:`~nemo_rl_gke.decide.job_stop.decide`; says once what the run's
        progress, convergence and deadline mean as they appear."""
        metrics = self.follower.metrics
        if verdict is not None and not verdict.stops_now and not self._converged_logged:
            # Said once, also when the save came in the same read (a stream chunk can hold both).
            self._converged_logged = True
            self.log.info("%s%s", verdict.message, " Waiting for the next checkpoint save." if saved is None else "")
        mark = progress_mark(metrics)
        if mark != self._progress:
            self._progress, self._progress_at = mark, now
        running = job_status not in TERMINAL
        no_learning = verdict is not None and verdict.stops_now
        converged_save = saved if verdict is not None and not no_learning else None
        # The clock is asked only when nothing before it in the rules' order ends the wait (it says what it sees).
        asks_clock = running and self.clock.deadline is not None and not no_learning and converged_save is None
        clock, near_save = self._clock_decision(now) if asks_clock else (None, None)
        return job_stop.Reading(
            status=job_status,
            exited_at_own_deadline=metrics.timeout_reached,
            no_learning=no_learning,
            converged_save=converged_save,
            clock=clock,
            save_since_near=near_save,
            stalled=running and now - self._progress_at >= stall_after(metrics.steps, self.stall_after_s),
            job_time_left_s=self.started_at + self.timeout - now,
        )

    def _clock_decision(self, now: float) -> tuple[str, int | None]:
        """The run clock's decision (:meth:`~nemo_rl_gke.run.deadline.RunClock.decide`) and, once the stop is to come
        at the job's next save, that save when it has finished; says once when the deadline passed with the job's own
        save still to come, and when the stop comes near."""
        steps = self.follower.metrics.steps
        stop_at = self.clock.stop_at(self._setup_done_at)
        deadline = self.clock.deadline
        assert deadline is not None
        if now >= deadline.at and stop_at > deadline.at and not self._overrun_said:
            self._overrun_said = True
            self.log.warning(
                "Ray job %s: %s has passed; waiting up to %.0fs more for the job's own deadline save (the "
                "deployment's budget_overrun_minutes)", self.submission_id, self.clock.limit_text(), stop_at - now,
            )  # fmt: skip
        decision = self.clock.decide(
            now,
            setup_done_at=self._setup_done_at,
            mean_step_s=mean_step_time(steps),
            save_begun=save_in_progress(steps),
        )
        if decision != STOP_AT_NEXT_SAVE:
            return decision, None
        if self._budget_near_index is None:
            self._budget_near_index = max(len(steps) - 1, 0)
            self.log.info(
                "Ray job %s: %.0fs left before the stop %s sets; stopping it at its next save", self.submission_id,
                stop_at - now, self.clock.limit_text(),
            )  # fmt: skip
        return decision, saved_after(steps, self._budget_near_index)

    async def _act(
        self,
        decision: job_stop.Decision,
        now: float,
        reading: job_stop.Reading,
        info: Mapping[str, Any],
        verdict: ZeroLearningVerdict | None,
    ) -> TriggerEvent:
        """Stop the job when the rule says so, and send the rule's event with its message."""
        outcome = await self._stop() if decision.stops_job else ""
        rule, status, job = decision.rule, reading.status, f"Ray job {self.submission_id}"
        steps = self.follower.metrics.steps
        if rule is job_stop.Rule.FINISHED:
            return await self._event(TERMINAL[status], _end_message(dict(info)), status, verdict)
        if rule is job_stop.Rule.ZERO_LEARNING:
            assert verdict is not None
            return await self._event(job_stop.ZERO_LEARNING, f"{verdict.message} {job}: {outcome}.", status, verdict)
        if rule is job_stop.Rule.CONVERGED:
            assert verdict is not None
            saved = reading.converged_save
            message = f"Converged at step {verdict.decided_at}; checkpoint step {saved} is saved. {job}: {outcome}."
            return await self._event(job_stop.CONVERGED, message, status, verdict, saved)
        if rule is job_stop.Rule.STALLED:
            return await self._event(job_stop.STALLED, self._stall_text(now, outcome), status, None, newest_save(steps))
        if rule is job_stop.Rule.TIMEOUT:
            message = f"{job} ran past the {self.timeout:.0f}s job timeout; {outcome}"
            return await self._event(job_stop.TIMED_OUT, message, status)
        # The budget rules: the stop record (which limit, the USD then, what was lost) goes with the event.
        saved = reading.save_since_near if rule is job_stop.Rule.DEADLINE_AT_SAVE else newest_save(steps)
        stop = self._stop_record(now, saved)
        if rule is job_stop.Rule.OWN_DEADLINE_SAVE:
            message = f"{self._budget_text(stop)}: the job saved step {saved} and exited by itself at NeMo RL's "
            message += "checkpoint_must_save_by"
            return await self._event(job_stop.BUDGET, message, status, verdict, saved, stop=stop)
        if rule is job_stop.Rule.DEADLINE_AT_SAVE:
            message = f"{self._budget_text(stop)}: checkpoint step {saved} is saved. {job}: {outcome}."
            return await self._event(job_stop.BUDGET, message, status, None, saved, stop=stop)
        message = f"{self._budget_text(stop)}: the deadline ({self.clock.limit_text()}) is reached; newest saved "
        message += f"step {saved}. {job}: {outcome}."
        if stop["lost"]:
            lost = stop["lost"]
            message += f" {lost['steps']} step(s) and {lost['gpu_hours']:.2f} GPU-hours were lost: {lost['why']}."
        return await self._event(job_stop.BUDGET, message, status, None, saved, stop=stop)

    def _stall_text(self, now: float, outcome: str) -> str:
        """The stalled job's message: where it stopped, for how long, the bound, and its newest save."""
        metrics = self.follower.metrics
        done = metrics.completed_steps
        at = done[-1].label if done else "0 (no step completed)"
        saved = newest_save(metrics.steps)
        kept = f"newest saved step {saved}" if saved is not None else "no checkpoint was saved"
        bound = stall_after(metrics.steps, self.stall_after_s)
        return (
            f"stalled at step {at}: no new step in the log for {now - self._progress_at:.0f}s (the bound is "
            f"{bound:.0f}s); {kept}. Ray job {self.submission_id}: {outcome}."
        )

    async def _status_when_due(self, now: float) -> dict[str, Any] | None:
        """The job's details (None: Ray has no such job), asked of Ray only when due. The log is pushed, and Ray
        closes its stream when the job is terminal: while the stream is live the status is asked on the long-wait
        schedule (:meth:`_poll_delay`), once it closed at every poll, and without a stream at every log download."""
        stream = self._ray.stream_state(self.submission_id)
        if now < self._status_due and stream == "live":
            return self._status_info
        self._status_due = now + (self.poll_interval if stream == "closed" else self._poll_delay(now))
        found = await self._ray.status(self.submission_id)
        if found is not None:
            self._status_info = found
        return found

    def _poll_delay(self, now: float) -> float:
        """Seconds to the next poll: the poll interval, stretched as the job runs on (a week-long job polls a few
        times as often as an hour's, :func:`~nemo_rl_gke.triggers.operations.long_wait_delay`), but never so long
        that a stop comes late: at the poll interval while a save is awaited, and at most half the time left before
        the run's deadline or the job timeout, and a quarter of the stall bound."""
        delay = long_wait_delay(self.poll_interval, now - (self.attempt_started_at or self.started_at))
        if delay <= self.poll_interval or self._converged_logged or self._budget_near_index is not None:
            return min(delay, self.poll_interval)
        ends = [self.started_at + self.timeout]
        if self.clock.deadline is not None:
            ends.append(self.clock.deadline.at)
        soonest = min(ends) - now
        bound = stall_after(self.follower.metrics.steps, self.stall_after_s)
        return max(self.poll_interval, min(delay, soonest / 2, bound / 4))

    # --- the run's clock and the stall rule ------------------------------------------------------------------------
    def _budget_text(self, stop: Mapping[str, Any]) -> str:
        done = len(self.follower.metrics.completed_steps)
        return budget_stop_text(done, self.max_steps or done, stop.get("usd"), stop.get("limit"))

    def _observe(self, now: float) -> None:
        """Note NeMo RL's setup end (the start of its deadline clock) and the newest finished save as they appear;
        say at once when the job's own deadline save will come after the latest stop the clock allows."""
        metrics = self.follower.metrics
        saved = newest_save(metrics.steps)
        if saved != self._newest[0]:
            self._newest = (saved, now)
        if self._setup_done_at is not None or not metrics.setup_complete:
            return
        self._setup_done_at = now
        took = now - (self.attempt_started_at or self.started_at)
        due = self.clock.job_save_due(now)
        if due is None:
            self.log.info("Ray job %s: NeMo RL's setup ended %.0fs after the submit", self.submission_id, took)
            return
        self.log.info(
            "Ray job %s: NeMo RL's setup ended %.0fs after the submit; its checkpoint_must_save_by clock started, so "
            "its deadline save is due in %.0fs", self.submission_id, took, due - now,
        )  # fmt: skip
        deadline = self.clock.deadline
        if deadline is not None and due > self.clock.cap:
            self._late_said = True
            self.log.warning(
                "Ray job %s: its deadline save is due %.0fs after the latest stop %s allows (%s): the steps since its "
                "newest save will be lost unless a periodic save comes first", self.submission_id,
                due - self.clock.cap, self.clock.limit_text(), "no overrun past it" if deadline.hard or not
                self.clock.overrun_s else f"{self.clock.overrun_s / 60:.0f} min of overrun included",
            )  # fmt: skip

    def _stop_record(self, now: float, saved: int | None) -> dict[str, Any]:
        """The deadline stop for the event: which limit, when, the USD spent then at the run's one price, and what
        was lost (the steps after the newest save and their GPU-hours)."""
        deadline = self.clock.deadline
        done = len(self.follower.metrics.completed_steps)
        newest_step, seen_at = self._newest
        attempt_start = self.attempt_started_at or self.started_at
        lost_steps = done if saved is None else max(0, done - _completed_through(self.follower.metrics, saved))
        lost_since = seen_at if newest_step is not None else attempt_start
        loss = self.clock.loss(
            steps_lost=lost_steps,
            lost_since=lost_since,
            stopped_at=now,
            setup_done_at=self._setup_done_at,
            attempt_started_at=attempt_start,
        )
        return {
            "limit": deadline.kind if deadline is not None else None,
            "what": deadline.what if deadline is not None else None,
            "deadline_at": deadline.at if deadline is not None else None,
            "stopped_at": now,
            "overrun_s": max(0.0, now - deadline.at) if deadline is not None else 0.0,
            "usd": self.clock.usd_at(now),
            "setup_done_at": self._setup_done_at,
            "lost": loss.to_dict() if (saved is None or lost_steps) else None,
        }

    async def on_kill(self) -> None:
        """The user marked the task failed/success or cleared it: stop the job (cleanup() never does)."""
        await self._ray_hook()
        if self.ray_token_secret and not self._ray.has_ray_token:
            try:
                await self._ray_token()
            except Exception as exc:
                self.log.warning("The Ray token could not be read (%s); stopping without it", type(exc).__name__)
        async with self._ray:
            outcome = await self._stop()
        self.log.warning("The task was killed: Ray job %s: %s", self.submission_id, outcome)


def _completed_through(metrics: Any, saved: int) -> int:
    """How many completed steps the save of global step ``saved`` holds (the steps up to the one that saved it)."""
    count = 0
    for step in metrics.steps:
        if step.completed:
            count += 1
        if step.checkpoint_step == saved:
            return count if step.completed else count + 1
    return count


def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (never inside a character), saying how much was left out."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}… [{len(text) - len(kept)} more chars]"


def _bounded_tail(lines: list[str]) -> list[str]:
    """The last lines, each clipped, as many as fit in :data:`TAIL_MAX_BYTES` (newest kept)."""
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        clipped = _clip(line, TAIL_LINE_MAX_BYTES)
        size += len(clipped.encode("utf-8", "replace")) + 1
        if size > TAIL_MAX_BYTES:
            break
        out.append(clipped)
    return out[::-1]


def _end_message(info: dict[str, Any]) -> str:
    """Ray's own account of a finished job: status, message, error type and the driver's exit code."""
    parts = [f"Ray job {info.get('submission_id') or info.get('job_id')} {info.get('status')}"]
    if info.get("message"):
        parts.append(f"message: {info['message']}")
    if info.get("error_type"):
        parts.append(f"error type: {info['error_type']}")
    if info.get("driver_exit_code") is not None:
        parts.append(f"driver exit code: {info['driver_exit_code']}")
    return "; ".join(parts)
