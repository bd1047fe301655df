"""The training view's FastAPI app, mounted in the Airflow API server by :mod:`nemo_rl_gke.plugin`.

Imported only by the API server (the plugin builds the app lazily), so FastAPI and Airflow's API modules are imported
here at module level: FastAPI resolves a route's annotations (``SessionDep``) from the module's globals.

Three routes under the plugin's prefix: the page (``/training``), its assets (``/training/static/...``) and the JSON
snapshot the page polls (``/training/data``). Plugin apps get no authentication from Airflow (FACTS §9), so every
route depends on Airflow's own access checks: a Bearer token or the UI's ``_token`` cookie, and read access to the
DAG's task instances (the data also needs its XComs and task logs). Without them: 401 (or 403).

It reads only what Airflow has, through the API server's own session: the run's task instances and their XComs,
the job's step metrics among them (the step store the trigger keeps, :mod:`nemo_rl_gke.observe.step_store`: a poll
reads its heads and only the chunks it has not cached, so it costs the same at step 10,000 as at step 10). A run
followed before the store existed is read from the ``train.wait`` task log (``TaskLogReader``). It holds no Google
credentials and starts nothing: the page is static, the data is built per request by
:func:`nemo_rl_gke.observe.training_view.build_view`, and the job's secrets (the passwords of the connections the
deployment allows for them) are masked in every answer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.common.db.common import SessionDep
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from nemo_rl_gke.observe import step_store
from nemo_rl_gke.observe.curves import CurveCache
from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics
from nemo_rl_gke.observe.redaction import StreamRedactor
from nemo_rl_gke.observe.training_view import BUDGET_SETTINGS, BUDGET_XCOM, TaskState, ViewInputs, build_view
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.deployment import load_deployment

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

STATIC = Path(__file__).parent / "static"
ASSETS = {"training_view.js": "text/javascript", "training_view.css": "text/css"}
# Log messages read per request at most: a multi-day job logs ~40 lines a step, the curves need only the metrics.
MAX_LOG_LINES = 2_000_000


def _when(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _xcoms(session: Session, dag_id: str, run_id: str, key: str, task_ids: Any = None) -> dict[str, Any]:
    """XCom values of one key in one run, by task id (map index -1 only)."""
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(run_id=run_id, key=key, dag_ids=dag_id, task_ids=task_ids, map_indexes=-1)
    return {row.task_id: XComModel.deserialize_value(row) for row in session.scalars(query)}


class StoreCache:
    """The step store's chunks the view has read, by run, job and chunk: a chunk with one after it is never written
    again (observe/step_store.py), so a poll reads only the heads and the newest chunk of each attempt. Bounded to the
    runs polled last. ``fetched`` counts the chunks read from the database (what the tests count)."""

    def __init__(self, runs: int = 32) -> None:
        self._runs: OrderedDict[tuple[str, str], dict[tuple[str, int], list[StepMetrics]]] = OrderedDict()
        self._limit = runs
        self.fetched = 0

    def attempts(self, session: Session, dag_id: str, run_id: str) -> list[RunMetrics]:
        """Each attempt's metrics, oldest first; empty when the run has no store (followed before it existed)."""
        from airflow.models.xcom import XComModel
        from sqlalchemy import select

        where = (
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.task_id == topology.WAIT,
            XComModel.map_index == -1,
        )
        rows = session.scalars(select(XComModel).where(*where, XComModel.key.startswith(step_store.HEAD_PREFIX)))
        heads = sorted(
            (h for h in (XComModel.deserialize_value(r) for r in rows) if step_store.valid_head(h)),
            key=lambda h: h["attempt"],
        )
        if not heads:
            return []
        cached = self._touch(dag_id, run_id)
        wanted = {}
        for head in heads:
            for index, key in enumerate(step_store.chunk_keys(head)):
                if (head["submission_id"], index) not in cached:
                    wanted[key] = (head["submission_id"], index, index < head["chunks"] - 1)
        fresh: dict[tuple[str, int], list[StepMetrics]] = {}
        if wanted:
            for row in session.scalars(select(XComModel).where(*where, XComModel.key.in_(list(wanted)))):
                submission, index, closed = wanted[row.key]
                steps = step_store.decode_chunk(XComModel.deserialize_value(row))
                self.fetched += 1
                if steps is not None:
                    fresh[(submission, index)] = steps
                    if closed:
                        cached[(submission, index)] = steps
        return [self._assembled(head, cached, fresh) for head in heads]

    def _touch(self, dag_id: str, run_id: str) -> dict[tuple[str, int], list[StepMetrics]]:
        """The run's cached chunks, the run moved to the newest end (the oldest run beyond the bound goes)."""
        cached = self._runs.pop((dag_id, run_id), {})
        self._runs[(dag_id, run_id)] = cached
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)
        return cached

    @staticmethod
    def _assembled(
        head: dict[str, Any],
        cached: dict[tuple[str, int], list[StepMetrics]],
        fresh: dict[tuple[str, int], list[StepMetrics]],
    ) -> RunMetrics:
        """One attempt's metrics from its chunks, up to the first one not there yet."""
        steps: list[StepMetrics] = []
        for index in range(head["chunks"]):
            chunk = cached.get((head["submission_id"], index)) or fresh.get((head["submission_id"], index))
            if chunk is None:
                break  # a save still being written: the head before it is what the next poll shows
            steps += chunk
        return step_store.from_steps(head, steps)


STORE_CACHE = StoreCache()
# Each run's curves as of its last poll (observe/curves.py): a poll computes only its newest steps.
CURVE_CACHE = CurveCache()


def _log_lines(ti: Any) -> list[str]:
    """The messages of the task's current try, in order (the triggerer's file included, interleaved)."""
    from airflow.utils.log.log_reader import TaskLogReader

    if not ti.try_number:
        return []
    stream, _ = TaskLogReader().read_log_chunks(ti, ti.try_number, {})
    lines: list[str] = []
    for message in stream:
        event = getattr(message, "event", None)
        if isinstance(event, str):
            lines.append(event)
            if len(lines) >= MAX_LOG_LINES:
                break
    return lines


def read_inputs(session: Session, dag_id: str, run_id: str) -> ViewInputs:
    """Everything :func:`build_view` needs about one run, read from the metadata DB and the task log."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        raise HTTPException(404, f"no run {run_id!r} of DAG {dag_id!r}")
    tis = session.scalars(
        select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.map_index == -1
        )
    ).all()
    tasks = {
        ti.task_id: TaskState(ti.task_id, str(ti.state or "none"), _when(ti.start_date), _when(ti.end_date),
                              int(ti.try_number or 0))
        for ti in tis
    }  # fmt: skip
    results = _xcoms(session, dag_id, run_id, topology.RETURN)
    summary = _xcoms(session, dag_id, run_id, topology.JOB_SUMMARY, topology.WAIT).get(topology.WAIT)
    budget = _xcoms(session, dag_id, run_id, BUDGET_XCOM, topology.WAIT).get(topology.WAIT)
    recoveries = _xcoms(session, dag_id, run_id, topology.JOB_RECOVERIES, topology.WAIT).get(topology.WAIT)
    history = _publish_history(session, dag_id)
    wait = next((ti for ti in tis if ti.task_id == topology.WAIT), None)
    attempts = STORE_CACHE.attempts(session, dag_id, run_id)
    # Only a run followed before the step store existed is read from its task log.
    lines = _log_lines(wait) if wait is not None and not attempts else []
    conf = results.get(topology.VALIDATE)
    return ViewInputs(
        dag_id=dag_id,
        run_id=run_id,
        run_state=str(run.state or "none"),
        now=time.time(),
        tasks=tasks,
        results=results,
        conf=conf if isinstance(conf, dict) else None,
        job_summary=summary if isinstance(summary, dict) else None,
        log_lines=lines,
        attempts=attempts,
        budget=budget if isinstance(budget, dict) else None,
        limits=budget_limits(),
        recoveries=recoveries if isinstance(recoveries, list) else (),
        history=history,
    )


# The runs whose scores the chart shows: a nightly schedule's last two months.
HISTORY_RUNS = 60


def _publish_history(session: Session, dag_id: str) -> list[dict[str, Any]]:
    """``checkpoint.publish``'s result of this DAG's newest runs, oldest first, each with its run_id."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    rows = session.scalars(
        select(XComModel)
        .join(DagRun, (DagRun.dag_id == XComModel.dag_id) & (DagRun.run_id == XComModel.run_id))
        .where(XComModel.dag_id == dag_id, XComModel.task_id == topology.PUBLISH, XComModel.key == topology.RETURN)
        .order_by(DagRun.id.desc())
        .limit(HISTORY_RUNS)
    ).all()
    found = []
    for row in reversed(rows):
        result = XComModel.deserialize_value(row)
        if isinstance(result, dict):
            found.append({**result, "run_id": row.run_id})
    return found


def budget_limits() -> dict[str, Any]:
    """The deployment's budget settings that exist on :class:`~nemo_rl_gke.run.deployment.Deployment` (the view's limits
    for a run whose train.wait has not published its budget)."""
    deployment = load_deployment()
    return {name: getattr(deployment, name) for name in BUDGET_SETTINGS if hasattr(deployment, name)}


def secret_values() -> list[str]:
    """The passwords of every connection the deployment allows for the job's secrets (never sent anywhere: only
    masked out of the view's answers)."""
    from airflow.models.connection import Connection

    deployment = load_deployment()
    values = []
    for conn_id in (*deployment.hf_conn_ids, *deployment.wandb_conn_ids):
        try:
            password = Connection.get_connection_from_secrets(conn_id).password
        except Exception:
            continue  # not defined here: then nothing of it can be in the view either
        if password:
            values.append(password)
    return values


def masked(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with every job secret replaced: the trigger masks the log already, this is the second line."""
    return StreamRedactor(secret_values()).redact_value(view)


def create_app() -> FastAPI:
    """The app the plugin mounts; every route requires a logged-in user with read access to the DAG."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag, requires_authenticated

    app = FastAPI(title="NeMo RL training view", docs_url=None, redoc_url=None, openapi_url=None)
    can_see_run = [Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))]
    can_read_data = [
        *can_see_run,
        Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
        Depends(requires_access_dag("GET", DagAccessEntity.TASK_LOGS)),
    ]

    @app.get("/training", response_class=HTMLResponse, dependencies=can_see_run)
    def page(dag_id: str = Query(), run_id: str = Query(), task_id: str | None = Query(None)) -> HTMLResponse:
        """The page: static HTML whose script polls ``data`` (no data is rendered server-side)."""
        return HTMLResponse((STATIC / "training_view.html").read_text(), headers={"Cache-Control": "no-store"})

    @app.get("/training/static/{name}", dependencies=[Depends(requires_authenticated())])
    def asset(name: str) -> FileResponse:
        """The page's script and style (bundled: the API server may have no internet)."""
        if name not in ASSETS:
            raise HTTPException(404, "no such asset")
        return FileResponse(STATIC / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    @app.get("/training/data", dependencies=can_read_data)
    def data(
        session: SessionDep, dag_id: str = Query(), run_id: str = Query(), since: str = Query("", max_length=64)
    ) -> JSONResponse:
        """One snapshot of the run (see :func:`nemo_rl_gke.observe.training_view.build_view`); ``since``: the token
        of the curves the page holds, so only what changed is sent."""
        curves = CURVE_CACHE.get(dag_id, run_id)
        with curves.lock:
            view = build_view(read_inputs(session, dag_id, run_id), curves, since)
        return JSONResponse(masked(view), headers={"Cache-Control": "no-store"})

    return app
