"""README "Running Airflow locally", run as written: its console block, command by command, then the run it starts.

The block runs in one bash, in a fresh directory laid out as the repository is (``dags``, ``plugins``, ``include``,
``sandbox`` and ``.venv`` linked in), so ``$PWD``, ``.airflow`` and ``.sandbox`` are the guide's own. Nothing of it is
rewritten: a guide that drifts from what works fails here. The run it triggers must succeed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from bench.airflow_components import Airflow, http_json, stop_airflow, wait_for, wait_run

from tests.paths import ROOT

pytestmark = pytest.mark.airflow
DAG_ID = "nemo_rl_grpo_gke"
SECTION = "## Running Airflow locally"
LINKED = ("dags", "plugins", "include", "sandbox", ".venv")
PORT = 8080
# Generous: the guide's run has none of the test stacks' heartbeat tuning, and CI machines are loaded.
RUN_TIMEOUT_S = 900


def guide_commands(readme: str) -> list[str]:
    """The commands of the section's console block: each ``$`` line with its ``\\`` continuations."""
    section = readme[readme.index(SECTION) :]
    block = re.search(r"```console\n(.*?)\n\s*```", section, re.S)
    assert block, f"no console block under {SECTION!r}"
    commands: list[str] = []
    for raw in block.group(1).splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            commands.append(line[2:])
        elif commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1].rstrip() + " " + line
        else:
            raise AssertionError(f"a console line that is neither a command nor a continuation: {raw!r}")
    return commands


def test_the_guide_block_is_commands_only_and_starts_everything_it_uses() -> None:
    commands = guide_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert commands[0].startswith(".venv/bin/python -m sandbox serve --port 8931")
    assert commands[-1] == 'airflow dags trigger nemo_rl_grpo_gke --conf "$(cat include/conf/local.json)"'
    # Every server the guide starts is on 127.0.0.1: the API server by its settings, the task-log servers are off.
    text = " ".join(commands)
    assert "AIRFLOW__API__HOST=127.0.0.1" in text and "airflow standalone" not in text
    assert all("--skip-serve-logs" in c for c in commands if re.search(r"airflow \$component|airflow scheduler", c))


def test_the_local_guide_runs_as_written_and_its_run_succeeds(tmp_path: Path) -> None:
    commands = guide_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    workspace = tmp_path / "guide"
    workspace.mkdir()
    for name in LINKED:
        (workspace / name).symlink_to(ROOT / name)
    # A user's shell: none of the test session's Airflow or sandbox settings leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONPATH", "SANDBOX"))}
    script = "set -euo pipefail\n" + "\n".join(commands) + "\n"
    log = (workspace / "guide.log").open("wb")
    process = subprocess.Popen(
        ["/bin/bash", "-c", script],
        cwd=workspace,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # the guide's background servers stay in this session, stopped with it below
    )
    airflow = Airflow(process, workspace / ".airflow", PORT, workspace / ".airflow")
    try:
        assert process.wait(timeout=600) == 0, (workspace / "guide.log").read_text(errors="replace")[-4000:]
        printed = (workspace / "guide.log").read_text(errors="replace")
        password = json.loads((airflow.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        status, body = http_json(f"{airflow.url}/auth/token", "POST", {"username": "admin", "password": password})
        assert status in {200, 201}, body
        airflow.token = body["access_token"]
        runs = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
        assert len(runs) == 1 and runs[0]["dag_run_id"] in printed, (runs, printed[-2000:])
        assert runs[0]["conf"] == json.loads((ROOT / "include/conf/local.json").read_text())
        run = wait_run(airflow, runs[0]["dag_run_id"], RUN_TIMEOUT_S)
        tasks = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances?limit=200")
        states = {ti["task_id"]: ti["state"] for ti in tasks["task_instances"]}
        assert run["state"] == "success", (states, airflow.log_tail())
        assert "failed" not in states.values() and "upstream_failed" not in states.values(), states
        # What the guide says to look at is there: the job's per-step table in train.wait's XCom.
        xcom = f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances/train.wait/xcomEntries/steps"
        steps = wait_for("train.wait's steps", lambda: airflow.api("GET", xcom)["value"], 30)
        assert [s["step"] for s in steps][:3] == [1, 2, 3]
    finally:
        stop_airflow(airflow)
        log.close()
