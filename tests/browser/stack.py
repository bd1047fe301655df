"""A real Airflow (scheduler, triggerer, dag-processor, API server) on the sandbox, and Chromium driving its UI.

The pieces the browser tests use, importable by any other test that needs the same stack: start it
(:func:`start_stack`), log a browser context in (:func:`login`), trigger and follow runs, open the training view of a
run and read what it shows. Everything binds 127.0.0.1; screenshots go to ``.airflow/screenshots/`` (not committed).

What a run left up: :func:`training_banner` and :func:`grid_task_states` read what a person then sees.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.airflow_components import (
    DAG_ID,
    Airflow,
    kill_component,
    run_path,
    running_airflow,
    task_instances,
    task_runner_pid,
    trigger,
    wait_for,
    wait_run,
    xcom_value,
)
from sandbox.demo import start_demo_sandbox
from sandbox.testing import SandboxProcess

from nemo_rl_gke import plugin
from nemo_rl_gke.run import topology
from tests.paths import ROOT

CHROMIUM = Path("/usr/bin/chromium")
# Debian's Chromium, headless, with nothing that reaches the network on its own (the machine has no internet).
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / ".airflow" / "screenshots"
LOCAL_CONF: dict[str, Any] = json.loads((ROOT / "include/conf/local.json").read_text())
HF_TOKEN = "hf_BROWSERTESTTOKEN_never_shown_5e2c"


@dataclass
class Stack:
    """The running sandbox and Airflow."""

    sandbox: SandboxProcess
    airflow: Airflow
    workdir: Path


@contextlib.contextmanager
def start_stack() -> Iterator[Stack]:
    """The sandbox (seeded for include/conf/local.json) and Airflow pointed at it; both stopped on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="nemo-rl-browser-"))
    sandbox, env = start_demo_sandbox(workdir, LOCAL_CONF)
    # The job's token connection holds a recognisable test token: no page may ever show it.
    env = {**env, "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": HF_TOKEN})}
    try:
        with running_airflow(workdir, sandbox.url, env) as airflow:
            yield Stack(sandbox, airflow, workdir)
    finally:
        sandbox.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def login(context: Any, airflow: Airflow) -> None:
    """Log a Playwright browser context in as the UI does: the JWT in the ``_token`` cookie."""
    context.add_cookies([{"name": "_token", "value": airflow.token, "url": airflow.url}])


def screenshot(page: Any, name: str, full_page: bool = True) -> Path:
    """Save a screenshot under .airflow/screenshots/ (a test artifact): the whole page, or only the window."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def run_url(airflow: Airflow, run_id: str) -> str:
    """The UI page of one run."""
    return f"{airflow.url}/dags/{DAG_ID}/runs/{urllib.parse.quote(run_id, safe='')}"


def view_url(airflow: Airflow, run_id: str, poll_s: float = 2.0) -> str:
    """The training view's own page (what the tab's iframe shows), polling every ``poll_s`` seconds."""
    query = urllib.parse.urlencode({"dag_id": DAG_ID, "run_id": run_id, "poll": poll_s})
    return f"{airflow.url}{plugin.URL_PREFIX}/training?{query}"


def view_data(airflow: Airflow, run_id: str) -> dict[str, Any]:
    """The JSON snapshot the page polls, fetched with the API token."""
    query = urllib.parse.urlencode({"dag_id": DAG_ID, "run_id": run_id})
    return airflow.api("GET", f"{plugin.URL_PREFIX}/training/data?{query}")


def task_state(airflow: Airflow, run_id: str, task_id: str) -> str:
    """One task instance's state ('none' before it has one)."""
    ti = airflow.api("GET", f"{run_path(run_id)}/taskInstances/{urllib.parse.quote(task_id, safe='')}")
    return str(ti.get("state") or "none")


def wait_task_state(airflow: Airflow, run_id: str, task_id: str, states: set[str], timeout: float) -> str:
    """Wait until the task is in one of ``states``; the state."""
    return wait_for(
        f"{task_id} in {sorted(states)}",
        lambda: (state := task_state(airflow, run_id, task_id)) in states and state,
        timeout,
        interval=0.5,
    )


def task_log(airflow: Airflow, run_id: str, task_id: str, try_number: int = 1) -> str:
    """A task try's log as the REST API gives it (every message's event, one per line)."""
    path = (
        f"{run_path(run_id)}/taskInstances/{urllib.parse.quote(task_id, safe='')}/logs/{try_number}?full_content=true"
    )
    body = airflow.api("GET", path)
    content = body.get("content") if isinstance(body, dict) else body
    if isinstance(content, list):
        return "\n".join(str(item.get("event", "")) if isinstance(item, dict) else str(item) for item in content)
    return str(content)


def extra_links(airflow: Airflow, run_id: str, task_id: str) -> dict[str, str | None]:
    """The extra links the UI shows on one task instance (name -> URL, None when hidden)."""
    path = f"{run_path(run_id)}/taskInstances/{urllib.parse.quote(task_id, safe='')}/links"
    return airflow.api("GET", path)["extra_links"]


def training_banner(frame: Any) -> list[dict[str, Any]]:
    """The training view's "still running" banner rows (task id, kind, name, state, USD/h, and whether the row is
    shown or folded into the free resources' line), as the page has them."""
    rows = []
    for row in frame.locator("#banner tr[data-task]").all():
        cells = row.locator("td").all_text_contents()
        rows.append({"task_id": row.get_attribute("data-task") or "", "kind": cells[0], "name": cells[1],
                     "state": cells[2], "usd_per_hour": cells[3], "shown": row.is_visible()})  # fmt: skip
    return rows


# What a person watching training came for: each must be above the fold of a 1400x1000 window.
LEAD = {"progress": "#progress", "reward curve": "#reward svg[data-curve='reward']", "budget": "#budget",
        "cost so far": "#cost-card"}  # fmt: skip


def layout(target: Any, settle_s: float = 10.0) -> dict[str, Any]:
    """Where the view's parts are (bounding boxes relative to the window, an iframe's included) and how the free
    resources' line is drawn: its height, its line height, whether it is open, and its text.

    Every poll draws the reward curve anew (a new ``svg``), so a box read as the old one is replaced comes back
    None (seen once in CI on a loaded machine): the boxes are read again, for up to ``settle_s``, until each is
    there. A part that is really missing or hidden stays None, and the caller's check fails on it."""
    deadline = time.monotonic() + settle_s
    while True:
        boxes = {name: target.locator(selector).bounding_box() for name, selector in LEAD.items()}
        if all(box is not None for box in boxes.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    free = target.locator("#free summary")
    line = free.evaluate("s => ({lineHeight: parseFloat(getComputedStyle(s).lineHeight), open: s.parentElement.open})")
    return {"boxes": boxes, "free": free.bounding_box(), "free_text": free.text_content() or "", **line}


def grid_task_states(airflow: Airflow, run_id: str) -> dict[str, str]:
    """Every task's state in the run (what the grid colours)."""
    return {ti["task_id"]: str(ti["state"]) for ti in task_instances(airflow, run_id)}


__all__ = [
    "DAG_ID",
    "Stack",
    "extra_links",
    "grid_task_states",
    "kill_component",
    "layout",
    "login",
    "run_url",
    "screenshot",
    "start_stack",
    "task_instances",
    "task_log",
    "task_runner_pid",
    "topology",
    "training_banner",
    "trigger",
    "view_data",
    "view_url",
    "wait_for",
    "wait_run",
    "wait_task_state",
    "xcom_value",
]
