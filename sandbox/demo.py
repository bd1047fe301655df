"""``make demo``: run the DAG end to end with ``airflow dags test`` and print what a person wants to see.

With ``--sandbox`` the run is in apply mode against the local GCP sandbox (started here, seeded with the
reservation, stopped at the end): every resource is created and deleted again through the production code. The
full Airflow output goes to a log file; the terminal gets the task states, what each task did, and the plan (or
the conf's findings) read back from the run's XCom in the metadata DB. Needs AIRFLOW_HOME and a migrated DB (the
Makefile does both). A development tool beside the sandbox: the deployed package never imports it.

    python -m sandbox.demo [--sandbox] --conf include/conf/local.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nemo_rl_gke.plan.ray_job import job_secrets
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.deployment import Deployment
from sandbox.testing import start_sandbox


def run_dags_test(dag_id: str, conf: str, log_path: Path, env: dict[str, str] | None = None) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.run(
            ["airflow", "dags", "test", dag_id, "-c", conf],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            env={**os.environ, **(env or {})},
        )
    return proc.returncode


def latest_run(dag_id: str) -> dict[str, Any]:
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


def demo_seed(conf: dict[str, Any]) -> dict[str, Any]:
    """What the sandbox needs for ``conf`` to run: its reservation and its export bucket (``include/conf/
    sandbox-seed.json`` is this for ``include/conf/local.json``, for a sandbox started by hand)."""
    from nemo_rl_gke.run.spec import RunSpec

    spec = RunSpec.from_conf(conf)
    return {
        "reservations": [
            {
                "project": spec.project,
                "zone": spec.zone,
                "name": spec.reservation,
                "machine_type": spec.effective_machine_type,
                "count": spec.worker_replicas,
            }
        ],
        # The export bucket, writable by the project's Lustre service agent (preflight_live checks both).
        "buckets": [
            {"project": spec.project, "name": spec.export_bucket_name, "lustre_agent_role": "roles/storage.objectUser"}
        ],
    }


def start_demo_sandbox(home: Path, conf: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The local GCP sandbox, seeded with the conf's reservation and export bucket, and the connection env for it."""
    from nemo_rl_gke.run.spec import RunSpec

    spec = RunSpec.from_conf(conf)
    seed = demo_seed(conf)
    # Operations take a few hundred milliseconds, so the waits really are deferrals.
    sandbox = start_sandbox(home / f"sandbox-{time.strftime('%Y%m%d-%H%M%S')}", latency_scale=0.002, seed=seed)
    # The sandbox's service-account key: google-auth's real JWT grant and refresh, as with a key file on GCP.
    conn = sandbox.connection_json(spec.project)
    # The local recipe needs no Hugging Face token, but the job always gets one: a placeholder stands in for it.
    hf = json.dumps({"conn_type": "generic", "password": "hf_sandbox_placeholder_token"})
    hf_conn_id = job_secrets(spec, Deployment.from_env())[0].conn_id
    return sandbox, {"AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": conn, f"AIRFLOW_CONN_{hf_conn_id.upper()}": hf}


def _what_it_did(result: Any) -> str:
    """One word or two for a task's return value: its action, its objects' actions, or the job's status."""
    if not isinstance(result, dict):
        return ""
    if "objects" in result and "action" not in result:
        counts: dict[str, int] = {}
        for obj in result["objects"]:
            counts[obj["action"]] = counts.get(obj["action"], 0) + 1
        return ", ".join(f"{n} {action}" for action, n in sorted(counts.items()))
    if "steps_completed" in result:
        return f"{result.get('status')}, {result['steps_completed']} steps"
    if "valid" in result:
        return f"valid, shards {result.get('shards')}"
    if "outcome" in result:  # checkpoint.publish
        return str(result["outcome"])
    if "score" in result:  # checkpoint.evaluate
        base = result.get("baseline")
        return f"score {result['score']:.4f} (base model {'-' if base is None else f'{base:.4f}'})"
    if "hf_path" in result:  # checkpoint.convert
        return f"{len(result.get('files') or ())} files in {result['hf_path'].rsplit('/', 2)[-2]}/hf"
    return str(result.get("action", ""))


def _print_run(run: dict[str, Any], elapsed: float) -> None:
    print(f"run {run['run_id']}: {run['state']} in {elapsed:.1f}s")
    for task_id, state, duration in run["tasks"]:
        result = run["xcom"].get((task_id, topology.RETURN))
        action = _what_it_did(result)
        print(f"  {task_id:<30} {state:<8} {duration:6.1f}s  {action}")
    findings = run["xcom"].get((topology.VALIDATE, topology.FINDINGS)) or run["xcom"].get(
        (topology.PREFLIGHT_LIVE, topology.FINDINGS)
    )
    if findings:
        print(f"\nThe run was refused before anything was created ({len(findings)} problem(s)):")
        for n, f in enumerate(findings, 1):
            print(f"  {n}. [{f['rule_id']}] {f['param']}: {f['rule']}.\n     Fix: {f['fix']}")


def _print_training(run: dict[str, Any], sandbox: Any) -> None:
    """Reward by step, the checkpoint's location and the run report, from the run's XCom."""
    xcom = run["xcom"]
    steps = xcom.get((topology.WAIT, topology.JOB_STEPS)) or []
    if steps:
        print("\nreward by step (avg reward of the batch):")
        for row in steps:
            reward = row.get("avg_reward") or 0.0
            print(f"  step {row['step']:>3}  {reward:6.4f}  {'#' * round(40 * reward)}")
    exported = xcom.get((topology.EXPORT, topology.RETURN)) or {}
    if exported.get("uri"):
        print(f"\ncheckpoint: {exported['uri']}")
        if sandbox is not None:
            local = Path(sandbox.state_dir) / "gcs" / exported["uri"].removeprefix("gs://")
            print(f"  (the sandbox's bucket directory: {local})")
    text = xcom.get((topology.RUN_REPORT, topology.REPORT_TEXT))
    if text:
        print("\n" + text)


def _bearer_summary(calls: list[dict[str, Any]], refused: list[dict[str, Any]]) -> str:
    """How many API calls the run made and whether each carried a valid bearer token (naming those that did not)."""
    if not refused:
        return f"{len(calls)} API calls, all with a valid bearer token"
    lines = [f"{len(calls)} API calls, {len(refused)} WITHOUT a valid bearer token:"]
    lines += [f"    {c['method']} {c['path']} -> {c['status']} (token {c.get('auth') or '?'})" for c in refused]
    return "\n".join(lines)


def plan_connection_env(conf: dict[str, Any]) -> dict[str, str]:
    """A plan-mode run's google_cloud_default: it names the conf's project, which the deployment's default bound
    allows, and its endpoint is a closed loopback port, so a plan that called Google by mistake fails here."""
    from nemo_rl_gke.run.spec import RunSpec

    extra = {"project": RunSpec.from_conf(conf).project, "api_endpoint": "http://127.0.0.1:9"}
    return {"AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps({"conn_type": "google_cloud_platform", "extra": extra})}


def main(argv: list[str] | None = None) -> int:
    """Run the DAG once with the given conf; exit 0 only if the run succeeded (and, on the sandbox, left nothing)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dag-id", default="nemo_rl_grpo_gke")
    parser.add_argument("--conf", type=Path, required=True, help="JSON file with the run conf")
    parser.add_argument("--sandbox", action="store_true", help="apply mode against a local GCP sandbox")
    args = parser.parse_args(argv)

    home = Path(os.environ["AIRFLOW_HOME"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = home / "logs" / f"demo-{stamp}.log"
    conf = json.loads(args.conf.read_text())
    sandbox, env = None, {}
    if args.sandbox:
        conf = {**conf, "mode": "apply", "poll_interval_s": 0.2}
        sandbox, env = start_demo_sandbox(home, conf)
        print(f"GCP sandbox on {sandbox.url} (pid {sandbox.pid}), connection google_cloud_default -> sandbox")
    else:
        env = plan_connection_env(conf)
    try:
        print(f"$ airflow dags test {args.dag_id} -c '<{args.conf} + mode {conf.get('mode', 'plan')}>'")
        print(f"  (full output: {log_path})")
        started = time.monotonic()
        code = run_dags_test(args.dag_id, json.dumps(conf), log_path, env)
        elapsed = time.monotonic() - started
        if code != 0 and "DagRun Finished" not in log_path.read_text():
            print(log_path.read_text()[-3000:])
            print(f"airflow dags test exited {code}: the run was not created (see above)")
            return code
        run = latest_run(args.dag_id)
        _print_run(run, elapsed)
        plan_text = run["xcom"].get((topology.PLAN, topology.PLAN_TEXT))
        if plan_text and sandbox is None:
            print("\n" + plan_text)
        elif plan_text:
            plan_path = home / "logs" / f"plan-{stamp}.txt"
            plan_path.write_text(plan_text)
            print(f"\nplan: {plan_text.splitlines()[0]}\n  (full plan: {plan_path})")
        _print_training(run, sandbox)
        leftover: list[Any] = []
        refused: list[dict[str, Any]] = []
        if sandbox is not None:
            inventory = sandbox.full_inventory()
            leftover = [*inventory["resources"], *inventory["kubernetes"], *inventory["ray_heads"]]
            calls = sandbox.calls()
            refused = [c for c in calls if c.get("auth") != "valid"]
            print(f"\nsandbox: {_bearer_summary(calls, refused)}")
            print(
                f"  left after teardown: {len(inventory['resources'])} GCP resource(s), "
                f"{len(inventory['kubernetes'])} Kubernetes object(s), {len(inventory['ray_heads'])} Ray process(es)"
            )
        return 0 if run["state"] == "success" and not leftover and not refused else 1
    finally:
        if sandbox is not None:
            sandbox.stop()


if __name__ == "__main__":
    sys.exit(main())
