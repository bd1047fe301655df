"""``make demo``: run a DAG end to end with ``airflow dags test`` and print what a person wants to see.

The full Airflow output goes to a log file; the terminal gets the task states, and the plan (or the conf's
findings) read back from the run's XCom in the metadata DB. Needs AIRFLOW_HOME and a migrated DB (the Makefile
does both).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _run_dags_test(dag_id: str, conf: str, log_path: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.run(
            ["airflow", "dags", "test", dag_id, "-c", conf], stdout=log, stderr=subprocess.STDOUT, check=False
        )
    return proc.returncode


def _latest_run(dag_id: str) -> dict[str, Any]:
    """The newest run of ``dag_id``: its id, state, task states and XComs, from the metadata DB."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).first()
        if run is None:
            raise SystemExit(f"no run of {dag_id} was created (see the log)")
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run.run_id).all()
        xcoms = session.query(XComModel).filter_by(dag_id=dag_id, run_id=run.run_id).all()
        return {
            "run_id": run.run_id,
            "state": str(run.state),
            "tasks": sorted(((ti.task_id, str(ti.state), ti.duration or 0.0) for ti in tis), key=lambda t: t[0]),
            "xcom": {(x.task_id, x.key): XComModel.deserialize_value(x) for x in xcoms},
        }


def main(argv: list[str] | None = None) -> int:
    """Run the DAG once with the given conf; exit 0 only if the run succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dag-id", default="nemo_rl_grpo_gke")
    parser.add_argument("--conf", type=Path, required=True, help="JSON file with the run conf")
    args = parser.parse_args(argv)

    home = Path(os.environ["AIRFLOW_HOME"])
    log_path = home / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    conf = args.conf.read_text()
    print(f"$ airflow dags test {args.dag_id} -c @{args.conf}   (full output: {log_path})")
    started = time.monotonic()
    code = _run_dags_test(args.dag_id, conf, log_path)
    elapsed = time.monotonic() - started
    if code != 0:
        print(log_path.read_text()[-3000:])
        print(f"airflow dags test exited {code}: the run was not created (see above)")
        return code
    run = _latest_run(args.dag_id)
    print(f"run {run['run_id']}: {run['state']} in {elapsed:.1f}s")
    for task_id, state, duration in run["tasks"]:
        print(f"  {task_id:<10} {state:<8} {duration:6.1f}s")
    findings = run["xcom"].get(("validate", "findings"))
    if findings:
        print(f"\nThe conf was rejected before anything was created ({len(findings)} problem(s)):")
        for n, f in enumerate(findings, 1):
            print(f"  {n}. [{f['rule_id']}] {f['param']}: {f['rule']}.\n     Fix: {f['fix']}")
    plan_text = run["xcom"].get(("plan", "plan_text"))
    if plan_text:
        print("\n" + plan_text)
    return 0 if run["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
