"""The demo run's makespan, stage by stage, and its ratio to the critical-path bound, measured in one run.

Runs the DAG once in apply mode with the local CPU recipe against a fresh sandbox (what `make demo` runs), then reads
the run report the DAG's last task computed: each stage's span, the critical path (the longest dependency chain,
weighted by the measured task durations) and the makespan. The ratio makespan / critical path says how much time
went to scheduling, triggers and queueing beyond what the task graph itself requires (1.0 is the bound).

    make bench-e2e        # or: AIRFLOW_HOME=... .venv/bin/python bench/e2e.py [--conf include/conf/local.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]


def main() -> int:
    """Run the demo conf once and print the stage table, the critical path and the ratio."""
    from sandbox.demo import latest_run, run_dags_test, start_demo_sandbox

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, default=ROOT / "include" / "conf" / "local.json")
    args = parser.parse_args()
    home = Path(os.environ["AIRFLOW_HOME"])
    conf = {**json.loads(args.conf.read_text()), "mode": "apply", "poll_interval_s": 0.2}
    sandbox, env = start_demo_sandbox(home, conf)
    try:
        started = time.monotonic()
        code = run_dags_test("nemo_rl_grpo_gke", json.dumps(conf), home / "logs" / "bench-e2e.log", env)
        wall = time.monotonic() - started
    finally:
        sandbox.stop()
    run = latest_run("nemo_rl_grpo_gke")
    report = run["xcom"].get(("report", "return_value")) or {}
    if code != 0 or not report.get("stages"):
        print(f"the run did not produce a report (exit {code}, state {run['state']}); see {home}/logs/bench-e2e.log")
        return 1
    print(f"run {run['run_id']}: {run['state']}, `airflow dags test` wall time {wall:.1f}s")
    print(f"\n{'stage':<12}{'start':>9}{'end':>9}{'span_s':>9}")
    t0 = report["run_start"]
    for stage in report["stages"]:
        if stage.get("start") is None:
            continue
        print(f"{stage['name']:<12}{stage['start'] - t0:>+9.1f}{stage['end'] - t0:>+9.1f}{stage['duration_s']:>9.1f}")
    path = report["critical_path"]
    print(f"\ncritical path ({len(path['steps'])} tasks): {' > '.join(s['task_id'] for s in path['steps'])}")
    print(f"critical-path bound   {path['total_s']:8.1f} s")
    print(f"makespan              {report['makespan_s']:8.1f} s")
    print(f"ratio makespan/bound  {report['schedule_ratio']:8.3f}")
    return 0 if run["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
