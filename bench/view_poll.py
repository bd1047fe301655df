"""The Training view's poll at 10,000 steps against the same poll at 100 steps, measured side by side in one run.

Two real plan-mode runs (``dag.test``) in a private metadata DB, each given a step store (the trigger's XCom rows,
``observe/step_store.py``) of 100 and of 10,000 steps, are polled through Airflow's own API server app with the
plugin mounted, as the page polls them: between two polls the job has made one more step, so each poll finds a new
chunk and head. The polls alternate between the two runs so drift hits both alike. A sample is the CPU time of the
poll (``process_time``: on a shared machine the wall time varies with the load) and the bytes of its answer.
Targets: time ratio <= 1.5, bytes ratio <= 2.

    .venv/bin/python bench/view_poll.py [--polls 15]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
TIME_TARGET, BYTES_TARGET = 1.5, 2.0
SMALL, LARGE = 100, 10_000


def airflow_home() -> Path:
    """A private Airflow home with a migrated metadata DB (set before anything imports airflow)."""
    home = Path(tempfile.mkdtemp(prefix="view-poll-"))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
    )
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)
    return home


def plan_runs(count: int) -> list[str]:
    """``count`` finished plan-mode runs of the tutorial conf; their run ids."""
    from tests.e2e.harness import load_dag, run_in_process

    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    # A closed loopback port: a plan calls no Google API.
    google = {
        "conn_type": "google_cloud_platform",
        "extra": {"project": conf["project"], "api_endpoint": "http://127.0.0.1:9"},
    }
    os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(google)
    dag = load_dag()
    ids = []
    for n in range(count):
        # Distinct logical dates: dag.test replaces a run of the same date.
        done = run_in_process(dag, conf, base=None, logical_date=datetime(2026, 1, 1 + n, tzinfo=UTC))
        if done.state != "success":
            raise SystemExit(f"the plan run failed: {done.tasks}")
        ids.append(done.run_id)
    return ids


class Store:
    """One run's step store, grown as a job would grow it."""

    def __init__(self, run_id: str) -> None:
        from nemo_rl_gke.observe.metrics import RunMetrics

        self.run_id = run_id
        self.metrics = RunMetrics()
        self.saved = 0

    def grow(self, steps: int) -> None:
        """Add steps up to ``steps`` and save what changed: the newest chunk and the head."""
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from tests.e2e.harness import DAG_ID

        from nemo_rl_gke.observe import step_store
        from nemo_rl_gke.observe.metrics import StepMetrics
        from nemo_rl_gke.run import topology

        while len(self.metrics.steps) < steps:
            n = len(self.metrics.steps) + 1
            reward = 0.1 + 0.8 * n / (n + 500) + ((n * 7919) % 13) / 100  # a rising, noisy curve
            step = StepMetrics(
                step=n, total_steps=20_000, loss=1 / (1 + n / 100), avg_reward=reward, total_step_time_s=9.0
            )
            self.metrics.steps.append(step)
        head, chunks = step_store.snapshot(
            self.metrics, submission_id="nemo-rl-job", offset=steps * 9000, lines=steps * 167, tail=[],
            saved_rows=self.saved,
        )  # fmt: skip
        where = {"dag_id": DAG_ID, "task_id": topology.WAIT, "run_id": self.run_id}
        with create_session() as session:
            for key, rows in chunks.items():
                XComModel.set(key, rows, **where, session=session)
            XComModel.set(step_store.head_key(0), head, **where, session=session)
        self.saved = steps


def main() -> int:
    """Measure; 0 when both ratios are within their targets, 1 when one is not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=15, help="polls of each run (default 15)")
    args = parser.parse_args()
    home = airflow_home()
    sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]
    try:
        from airflow.api_fastapi.app import create_app, get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from fastapi.testclient import TestClient
        from tests.e2e.harness import DAG_ID

        from nemo_rl_gke import plugin, view_app

        stores = {size: Store(run_id) for size, run_id in zip((SMALL, LARGE), plan_runs(2), strict=True)}
        for size, store in stores.items():
            store.grow(size)
        with TestClient(create_app(apps="core"), base_url="http://127.0.0.1") as client:
            token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
            headers = {"Authorization": f"Bearer {token}"}

            tokens: dict[str, str] = {}

            def poll(store: Store) -> tuple[float, int, dict[str, Any]]:
                # As the page polls: with the token of the curves it holds (static/training_view.js).
                query = {"dag_id": DAG_ID, "run_id": store.run_id, "since": tokens.get(store.run_id, "")}
                began = time.process_time()
                answer = client.get(f"{plugin.URL_PREFIX}/training/data?{urlencode(query)}", headers=headers)
                took = time.process_time() - began
                answer.raise_for_status()
                view = answer.json()
                tokens[store.run_id] = view["series_window"]["token"]
                return took, len(answer.content), view

            first = {size: poll(store) for size, store in stores.items()}  # every chunk once, every point once
            samples: dict[int, list[tuple[float, int]]] = {SMALL: [], LARGE: []}
            fetched_before = view_app.STORE_CACHE.fetched
            sent: dict[int, list[int]] = {SMALL: [], LARGE: []}
            for _ in range(args.polls):
                for size, store in stores.items():
                    store.grow(len(store.metrics.steps) + 1)
                    took, size_b, view = poll(store)
                    samples[size].append((took, size_b))
                    sent[size].append(len(view["series"]["reward"]))
            fetched = view_app.STORE_CACHE.fetched - fetched_before
    finally:
        shutil.rmtree(home, ignore_errors=True)
    cpu = {size: statistics.median(t for t, _ in rows) for size, rows in samples.items()}
    sent_b = {size: statistics.median(b for _, b in rows) for size, rows in samples.items()}
    for size in (SMALL, LARGE):
        took, size_b, view = first[size]
        points = view["shown"]["reward"]
        print(f"{size:>6} steps: first poll {took * 1000:6.1f} ms CPU, {size_b / 1024:6.1f} KiB ({points} reward "
              f"points); then {cpu[size] * 1000:6.1f} ms CPU, {sent_b[size] / 1024:5.1f} KiB and "
              f"{statistics.median(sent[size]):.0f} reward points per poll")  # fmt: skip
    print(f"store chunks fetched over {2 * args.polls} steady polls: {fetched} (the open chunk, once a poll)")
    time_ratio, bytes_ratio = cpu[LARGE] / cpu[SMALL], sent_b[LARGE] / sent_b[SMALL]
    verdicts = {
        f"poll time at {LARGE:,} steps / at {SMALL}: {time_ratio:.2f} (target <= {TIME_TARGET})": time_ratio
        <= TIME_TARGET,
        f"bytes per poll at {LARGE:,} steps / at {SMALL}: {bytes_ratio:.2f} (target <= {BYTES_TARGET})": bytes_ratio
        <= BYTES_TARGET,
    }
    for what, held in verdicts.items():
        print(f"{'OK' if held else 'MISSED'}: {what}")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
