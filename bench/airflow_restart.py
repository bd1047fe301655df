"""The triggerer killed while train.wait follows the job: how long until a new one follows it on, and the log.

A whole local run on a real scheduler, triggerer, dag-processor and API server against the sandbox. Once the job
has logged ``--kill-after`` steps into the train.wait task log, the triggerer is killed with SIGKILL; the stack's
supervisor starts it again a second later, as compose's ``restart: unless-stopped`` would. Printed, side by side in
one run:

- the seconds from the kill until a new trigger follows the job (its "Following Ray job" line; the triggerer health
  threshold is ``--health-threshold`` seconds for this, the package's recommended 15 s by default);
- the run's end state, the Ray jobs submitted (the training job and the checkpoint's validation job), and how many
  of the job's steps are in the task log once, twice or not at all.

Exit status: 0 when the run succeeded with one training job and every step's line exactly once, 1 when not, 2 when
the bench failed. Everything it starts is stopped on exit.

    .venv/bin/python bench/airflow_restart.py [--steps 60] [--kill-after 5] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import (  # noqa: E402
    Airflow,
    kill_component_when,
    run_bench,
    run_path,
    running_airflow,
    trigger,
    wait_for,
    wait_run,
)
from sandbox.demo import start_demo_sandbox  # noqa: E402

from nemo_rl_gke.observe.driver_log import FOLLOWING, JOB_LINE  # noqa: E402
from nemo_rl_gke.run import topology  # noqa: E402
from nemo_rl_gke.triggers.log_position import XCOM_KEY as LOG_POSITION  # noqa: E402


def wait_log(airflow: Airflow, run_id: str) -> str:
    """train.wait's first try's log, as the REST API gives it (one event per line)."""
    task = urllib.parse.quote(topology.WAIT, safe="")
    # 404 until the scheduler has made train.wait's task instance.
    body = airflow.api("GET", f"{run_path(run_id)}/taskInstances/{task}/logs/1?full_content=true", expect=(200, 404))
    content = body.get("content", "") if isinstance(body, dict) else body
    if isinstance(content, list):
        return "\n".join(str(i.get("event", "")) if isinstance(i, dict) else str(i) for i in content)
    return str(content)


def step_counts(log: str) -> dict[int, int]:
    """How often each step's reward line is in the log (NeMo RL prints one per step, after its header)."""
    counts: dict[int, int] = {}
    step = 0
    for line in log.splitlines():
        if (m := re.search(re.escape(JOB_LINE) + r"=+ Step (\d+)/\d+", line)) is not None:
            step = int(m.group(1))
        elif JOB_LINE in line and "Avg Reward" in line:
            counts[step] = counts.get(step, 0) + 1
    return counts


def logged_lines(log: str) -> int:
    """The job's driver-log lines in a task log (the trigger writes each as one ``[ray job]`` line)."""
    return sum(1 for line in log.splitlines() if JOB_LINE in line)


def position_covers_the_log(airflow: Airflow, run_id: str) -> bool:
    """Whether train.wait's saved log position (triggers/log_position.py) accounts for every job line in its task
    log: then a triggerer killed now repeats none (one killed between a step's lines and their save repeats them)."""
    task = urllib.parse.quote(topology.WAIT, safe="")
    path = f"{run_path(run_id)}/taskInstances/{task}/xcomEntries/{LOG_POSITION}"
    saved = airflow.api("GET", path, expect=(200, 404))
    value = saved.get("value") if isinstance(saved, dict) else None
    if isinstance(value, str):
        value = json.loads(value)
    return isinstance(value, dict) and value.get("lines") == logged_lines(wait_log(airflow, run_id))


# Tries to freeze the triggerer at a step boundary: such a moment comes once per step, and on a loaded machine a try
# (two API reads while it is frozen) is slow and misses many of them; 50 tries ran out in a full-suite run.
BETWEEN_STEPS_TRIES = 300


def kill_the_triggerer_between_steps(airflow: Airflow, run_id: str) -> list[int]:
    """SIGKILL the triggerer at a moment its saved log position covers the task log (frozen, checked, killed)."""
    return kill_component_when(
        airflow, "triggerer", lambda: position_covers_the_log(airflow, run_id), attempts=BETWEEN_STEPS_TRIES
    )


def measure(args: argparse.Namespace, workdir: Path, running: dict[str, Any]) -> bool:
    """One run, one triggerer kill; print what it took and what the log holds."""
    conf = json.loads((ROOT / "include/conf/local.json").read_text())
    conf.update({"max_steps": args.steps, "zero_learning_guard": False})
    sandbox, env = start_demo_sandbox(workdir, conf)
    running["sandbox"] = sandbox
    env = {**env, "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(args.health_threshold)}
    with running_airflow(workdir, sandbox.url, env) as airflow:
        run_id = trigger(airflow, conf)
        print(f"run {run_id}: {args.steps} steps, the triggerer killed after step {args.kill_after}", flush=True)
        wait_for(
            f"{args.kill_after} steps in the task log",
            lambda: wait_log(airflow, run_id).count("Avg Reward") >= args.kill_after,
            args.run_timeout,
            interval=1.0,
        )
        killed_at = time.monotonic()
        print(f"killed the triggerer: pids {kill_the_triggerer_between_steps(airflow, run_id)}", flush=True)
        wait_for(
            "the new trigger to follow the job",
            lambda: wait_log(airflow, run_id).count(FOLLOWING) >= 2,
            args.run_timeout,
            1.0,
        )
        resumed_s = time.monotonic() - killed_at
        run = wait_run(airflow, run_id, args.run_timeout)
        log = wait_log(airflow, run_id)
        # Every Ray job submission went through the sandbox's service proxy: train.submit's and checkpoint.validate's.
        jobs = [c for c in sandbox.calls() if c["method"] == "POST" and c["path"].endswith("/api/jobs/")]
    counts = step_counts(log)
    once = sum(1 for n in counts.values() if n == 1)
    twice = sorted(s for s, n in counts.items() if n > 1)
    missing = sorted(set(range(1, args.steps + 1)) - set(counts))
    print(
        f"\nkill -> a new trigger follows the job: {resumed_s:.1f} s "
        f"(triggerer health threshold {args.health_threshold:.0f} s)"
    )
    print(f"run {run['state']}; Ray job submissions: {len(jobs)} (train.submit's and checkpoint.validate's: 2)")
    print(f"steps in the task log: {once} once, twice {twice or 'none'}, missing {missing or 'none'}")
    return run["state"] == "success" and len(jobs) == 2 and once == args.steps and not twice


def main() -> int:
    """0 when the run succeeded with every step logged once, 1 when not, 2 when the bench failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps of the local recipe (default 60)")
    parser.add_argument("--kill-after", type=int, default=5, help="kill the triggerer after this step (default 5)")
    parser.add_argument("--health-threshold", type=float, default=15.0, help="triggerer_health_check_threshold (s)")
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds for each wait (default 900)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home)")
    args = parser.parse_args()
    return run_bench("airflow-restart-", args.keep, lambda workdir, running: measure(args, workdir, running))


if __name__ == "__main__":
    sys.exit(main())
