"""Provisioning makespan of the real DAG on a real Airflow, against the critical-path bound and the sum of all steps.

One run: the sandbox with its latency model (scaled by ``--scale``) and the default RunSpec's reservation seeded, then
the components ``airflow standalone`` runs (scheduler with the LocalExecutor, triggerer, dag-processor, api-server) in
a private temp AIRFLOW_HOME, everything on 127.0.0.1 only. The bench triggers ``nemo_rl_grpo_gke`` over the REST API
with ``mode=apply, teardown_policy=keep_all`` (only provisioning is measured), waits for the run, reads its task
instances and prints, from that one run:

- a per-task table of the ensure tasks (groups network/storage/cluster): start offset, duration (deferral included),
  the latency of the sandbox operation the task waited on, and the Airflow time before and after that operation;
- the provisioning makespan: the last end minus the first start among the ensure tasks;
- the critical-path bound NET + max(storage chain, cluster chain) and the sum of all 18 steps, each twice: from the
  task durations measured in this run, and from the sandbox's configured step latencies (scaled);
- ratio 1 = makespan / critical-path bound (target <= 1.10) and ratio 2 = makespan / sum (target <= 0.55), against
  both. Against measured durations the ratios show the gaps *between* tasks (scheduling, dependencies); against the
  configured latencies they also charge every task's own Airflow overhead (start-up, trigger pick-up, resume).

Exit status: 0 when the gated ratios (``--gate``, default both bases) meet their targets, 1 when one misses, 2 when
the bench itself failed. Everything it starts (the sandbox by PID, Airflow by process group and session) is stopped
and its temp dir removed on exit, Ctrl-C and failure included.

    .venv/bin/python bench/provision_makespan.py [--scale 0.25] [--poll-interval 1.0] [--gate both] [--keep]

Scale 0.25 (cluster create 420 s -> 105 s, node pool 75 s, Lustre 150 s; critical path 185 s; about 4.5 minutes in
all) keeps the steps on the critical path 20 to 50 times longer than Airflow's per-task overhead here (about 2-4 s a
task, most of it in the resume after the deferral), so the ratios measure the DAG and its scheduling rather than
process start-up, yet stays within a 10-minute budget on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import (  # noqa: E402
    Airflow,
    BenchError,
    http_json,
    run_bench,
    start_airflow,
    wait_for,
    wait_ready,
)
from sandbox.testing import start_sandbox  # noqa: E402

from nemo_rl_gke.run import topology as t  # noqa: E402

DAG_ID = "nemo_rl_grpo_gke"
HOST = "127.0.0.1"
TARGET_CRITICAL = 1.10
TARGET_SUM = 0.55
GROUPS = tuple(f"{group}." for group in (t.NETWORK, t.STORAGE, t.CLUSTER))
# The default RunSpec's reservation (project nemo-rl-demo, zone us-central1-b, a4-highgpu-8g, 2 nodes).
SEED = {
    "reservations": [
        {
            "project": "nemo-rl-demo",
            "zone": "us-central1-b",
            "name": "nemo-rl-reservation",
            "machine_type": "a4-highgpu-8g",
            "count": 2,
        }
    ],
    # The export bucket, writable by the project's Lustre service agent (preflight_live checks both).
    "buckets": [
        {
            "project": "nemo-rl-demo",
            "name": "nemo-rl-demo-nemo-rl-checkpoints",
            "lustre_agent_role": "roles/storage.objectUser",
        }
    ],
}
# The sandbox operation kind each ensure task waits on (sandbox/operations.py DEFAULT_LATENCY_SECONDS).
KIND = {
    t.NET: "compute.networks.insert",
    t.GVNIC_NET: "compute.networks.insert",
    t.RDMA_NET: "compute.networks.insert",
    t.GVNIC_SUB: "compute.subnetworks.insert",
    **{sub: "compute.subnetworks.insert" for sub in t.RDMA_SUBS},
    t.GVNIC_FW: "compute.firewalls.insert",
    t.PEERING_RANGE: "compute.globalAddresses.insert",
    t.PEERING: "servicenetworking.connections.create",
    t.LUSTRE: "lustre.instances.create",
    t.GKE_CLUSTER: "container.clusters.create",
    t.NODE_POOL: "container.nodePools.create",
}


# Airflow's components, started and stopped the way the browser tests do (bench/airflow_components.py).
def run_dag(airflow: Airflow, conf: dict[str, Any], timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Trigger one run, wait until it ends (bounded), return it and its task instances."""
    run = airflow.api("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})
    run_id = run["dag_run_id"]
    print(f"triggered {DAG_ID} run {run_id}", flush=True)

    def finished() -> dict[str, Any] | None:
        current = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
        return current if current["state"] in {"success", "failed"} else None

    done = wait_for(f"run {run_id} to finish", finished, timeout, interval=2.0)
    tis = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    for ti in tis:
        # A retried task's own row starts at its last try: read every try, so its start is the first try's.
        if ti["task_id"].startswith(GROUPS) and (ti.get("try_number") or 1) > 1:
            path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/tries"
            ti["tries"] = sorted(airflow.api("GET", path)["task_instances"], key=lambda t: t["try_number"])
    return done, tis


# ---------------------------------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------------------------------
def when(stamp: str | None) -> float | None:
    """Epoch seconds of an API timestamp."""
    return datetime.fromisoformat(stamp).timestamp() if stamp else None


def longest_path(tasks: list[str], upstream: dict[str, set[str]], weight: dict[str, float]) -> tuple[float, list[str]]:
    """The heaviest path through the DAG restricted to ``tasks`` (node weights), and the path."""
    best: dict[str, tuple[float, list[str]]] = {}

    def visit(task: str) -> tuple[float, list[str]]:
        if task not in best:
            ups = [visit(u) for u in upstream.get(task, set()) if u in weight]
            base = max(ups, default=(0.0, []))
            best[task] = (base[0] + weight[task], [*base[1], task])
        return best[task]

    return max((visit(t) for t in tasks), default=(0.0, []))


def chains(weight: dict[str, float]) -> dict[str, float]:
    """The issue's formula, term by term (weights by resource key).

    NET + max(storage chain, cluster chain) with storage chain = peering-range + peering + lustre and cluster chain =
    max(cluster, gVNIC/RDMA subnet chains - NET) + node-pool. The node pool also waits on the subnets, but their
    chains start with NET (all three networks start together after preflight), so a subnet chain only counts beyond
    NET; with the sandbox's latencies (network 20 s + subnet 10 s vs NET 20 s + cluster 420 s) it never wins.
    """
    net = weight[t.NET]
    subnet_chain = max(
        weight[t.GVNIC_NET] + weight[t.GVNIC_SUB],
        weight[t.RDMA_NET] + max(weight[sub] for sub in t.RDMA_SUBS),
    )
    storage = weight[t.PEERING_RANGE] + weight[t.PEERING] + weight[t.LUSTRE]
    cluster = max(weight[t.GKE_CLUSTER], subnet_chain - net) + weight[t.NODE_POOL]
    return {
        "net": net,
        "storage": storage,
        "cluster": cluster,
        "subnet_chain": subnet_chain,
        "bound": net + max(storage, cluster),
    }


def match_operations(operations: list[dict[str, Any]], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The create operation each ensure task waited on, by resource key (by kind, then by name in the target)."""
    found: dict[str, dict[str, Any]] = {}
    for key, kind in KIND.items():
        candidates = [o for o in operations if o["kind"] == kind]
        if len(candidates) > 1:
            candidates = [o for o in candidates if o["target"].rsplit("/", 1)[-1] == names.get(key)]
        if candidates:
            found[key] = candidates[0]
    return found


def resource_names() -> dict[str, str]:
    """Resource key -> name for the default apply conf (from the package, so the bench never drifts from it)."""
    from nemo_rl_gke.gcp.resources import resources
    from nemo_rl_gke.preflight.offline import check_conf
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.ownership import Owner

    spec, _ = check_conf({"mode": "apply", "teardown_policy": t.KEEP_ALL})
    assert spec is not None
    # Names only: whose they are does not change them.
    owner = Owner(Deployment().deployment_id, spec.group_id, f"{DAG_ID}/bench")
    return {key: res.name for key, res in resources(spec, owner).items()}


@dataclass
class Timeline:
    """The ensure tasks of one run, keyed by resource key: when each started and ended, and what the sandbox says."""

    start: dict[str, float]
    end: dict[str, float]
    configured: dict[str, float]  # the sandbox's scaled latency of each task's operation
    upstream: dict[str, set[str]]  # resource key -> upstream resource keys (ensure tasks only)
    tries: dict[str, list[dict[str, Any]]]
    operations: dict[str, dict[str, Any]]

    @property
    def duration(self) -> dict[str, float]:
        return {k: self.end[k] - self.start[k] for k in self.start}

    @property
    def makespan(self) -> float:
        return max(self.end.values()) - min(self.start.values())


def timeline(
    tis: list[dict[str, Any]],
    dag_tasks: list[dict[str, Any]],
    latency: dict[str, Any],
    operations: list[dict[str, Any]],
) -> Timeline:
    """The ensure tasks (groups network/storage/cluster) of a finished run; every one must have succeeded."""
    ensure = {ti["task_id"]: ti for ti in tis if ti["task_id"].startswith(GROUPS) and ti.get("map_index", -1) == -1}
    failed = {t: ti["state"] for t, ti in ensure.items() if ti["state"] != "success" or not ti["end_date"]}
    if failed or len(ensure) != len(KIND):
        raise BenchError(f"ensure tasks did not all succeed: {failed or sorted(ensure)}")
    key = {task_id: task_id for task_id in ensure}  # resource keys are the topology's task ids
    upstream: dict[str, set[str]] = {key[t]: set() for t in ensure}
    for task in dag_tasks:
        for down in task.get("downstream_task_ids", []):
            if down in ensure and task["task_id"] in ensure:
                upstream[key[down]].add(key[task["task_id"]])
    return Timeline(
        # A retried task starts at its first try.
        start={
            key[t]: min(when(x["start_date"]) for x in [ti, *ti.get("tries", [])] if x["start_date"])
            for t, ti in ensure.items()
        },
        end={key[t]: when(ti["end_date"]) for t, ti in ensure.items()},
        configured={key[t]: float(latency["scaled_seconds"][KIND[key[t]]]) for t in ensure},
        upstream=upstream,
        tries={key[t]: ti["tries"] for t, ti in ensure.items() if ti.get("tries")},
        operations=match_operations(operations, resource_names()),
    )


def print_tasks(run: Timeline) -> None:
    """The per-task table: start offset, duration, the operation's latency and the Airflow time around it."""
    t0 = min(run.start.values())
    print(f"{'task':<24}{'start':>8}{'dur':>8}{'op':>8}{'before':>8}{'after':>8}")
    for key in sorted(run.start, key=lambda k: (run.start[k], k)):
        op = run.operations.get(key)
        cells = ["-", "-", "-"]
        if op and op.get("end") is not None:
            before, after = op["start"] - run.start[key], run.end[key] - op["end"]
            cells = [f"{op['end'] - op['start']:.1f}", f"{before:.1f}", f"{after:.1f}"]
        row = f"{key:<24}{run.start[key] - t0:>8.1f}{run.duration[key]:>8.1f}"
        print(row + "".join(f"{x:>8}" for x in cells))
    print("(seconds. start: from the first ensure task's start; dur: task duration, deferral included; op: the")
    print(" sandbox operation's latency; before: task start -> operation start; after: operation end -> task end)")
    for key, tries in sorted(run.tries.items()):
        done = [x for x in tries if x["start_date"] and x["end_date"]]
        text = ", ".join(
            f"try {x['try_number']} {x['state']} ({when(x['end_date']) - when(x['start_date']):.1f} s)" for x in done
        )
        print(f"retried: {key}: {text}; its duration spans every try")


def print_ratios(run: Timeline, gate: str) -> bool:
    """The bounds, sums and both ratios, measured and configured side by side; True when the gated ones pass."""
    measured, configured = run.duration, run.configured
    m, c = chains(measured), chains(configured)
    m_path, path = longest_path(list(measured), run.upstream, measured)
    c_path, _ = longest_path(list(configured), run.upstream, configured)
    rows = [
        ("NET (network.net)", m["net"], c["net"]),
        ("storage chain (range+peering+lustre)", m["storage"], c["storage"]),
        ("cluster chain (cluster+node-pool)", m["cluster"], c["cluster"]),
        ("  subnet chain (for the node pool)", m["subnet_chain"], c["subnet_chain"]),
        ("critical-path bound NET+max(...)", m["bound"], c["bound"]),
        ("longest path through the DAG", m_path, c_path),
        (f"sum of all {len(measured)} steps", sum(measured.values()), sum(configured.values())),
    ]
    print(f"{'':<40}{'measured':>10}{'configured':>12}")
    for label, a, b in rows:
        print(f"{label:<40}{a:>10.1f}{b:>12.1f}")
    print(f"{'provisioning makespan':<40}{run.makespan:>10.1f}")
    print(f"critical path (measured): {' -> '.join(path)}")
    ratios = {
        "measured": (run.makespan / max(m["bound"], m_path), run.makespan / sum(measured.values())),
        "configured": (run.makespan / max(c["bound"], c_path), run.makespan / sum(configured.values())),
    }
    gated = ("measured", "configured") if gate == "both" else (gate,)
    ok = True
    print()
    print(f"{'':<40}{'measured':>10}{'configured':>12}  target   gate")
    targets = (("ratio 1 makespan/critical-path bound", TARGET_CRITICAL), ("ratio 2 makespan/sum of steps", TARGET_SUM))
    for n, (label, target) in enumerate(targets):
        verdicts = []
        for basis in gated:
            met = ratios[basis][n] <= target
            ok = ok and met
            verdicts.append(f"{basis} {'OK' if met else 'MISSED'}")
        line = f"{label:<40}{ratios['measured'][n]:>10.3f}{ratios['configured'][n]:>12.3f}  <= {target:.2f}  "
        print(line + ", ".join(verdicts))
    return ok


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=0.25,
        help="sandbox latency scale (default 0.25: cluster create 105 s, Lustre 150 s, critical path 185 s)",
    )
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the run's poll_interval_s (default 1.0)")
    parser.add_argument("--start-timeout", type=float, default=120.0, help="seconds for Airflow to come up")
    parser.add_argument(
        "--run-timeout", type=float, help="seconds for the DAG run to finish (default 120 + 1.5 x the scaled bound)"
    )
    parser.add_argument(
        "--gate",
        choices=("measured", "configured", "both"),
        default="both",
        help="what the exit status checks the ratios against: the measured task durations, the sandbox's configured "
        "latencies, or both (default)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home) for inspection")
    args = parser.parse_args()
    if args.scale <= 0:
        parser.error("--scale must be > 0: the bench measures against the latency model")
    if args.run_timeout is None:
        # The configured critical path is 740 s at scale 1 (NET 20 + cluster 420 + node pool 300).
        args.run_timeout = 120.0 + 1.5 * 740.0 * args.scale
    return args


def measure(args: argparse.Namespace, workdir: Path, started: float, running: dict[str, Any]) -> bool:
    """Start the sandbox and Airflow (recorded in ``running`` for the caller to stop), run the DAG, print; pass?"""
    sandbox = running["sandbox"] = start_sandbox(workdir / "sandbox", latency_scale=args.scale, seed=SEED)
    print(f"sandbox {sandbox.url} (pid {sandbox.pid}, latency scale {args.scale})", flush=True)
    airflow = running["airflow"] = start_airflow(workdir, sandbox.url)
    print(f"airflow {airflow.url} (process group {airflow.process.pid}, home {airflow.home})", flush=True)
    wait_ready(airflow, args.start_timeout)
    print(f"airflow ready after {time.monotonic() - started:.0f} s", flush=True)
    # Provisioning only: the run stops after the infrastructure (no RayCluster, no job) and keeps it.
    conf = {
        "mode": "apply",
        "stop_after": t.CLUSTER,
        "teardown_policy": t.KEEP_ALL,
        "poll_interval_s": args.poll_interval,
    }
    run, tis = run_dag(airflow, conf, args.run_timeout)
    print(f"run {run['state']} in {when(run['end_date']) - when(run['start_date']):.1f} s", flush=True)
    if run["state"] != "success":
        bad = {ti["task_id"]: ti["state"] for ti in tis if ti["state"] not in {"success", "skipped"}}
        raise BenchError(f"run {run['dag_run_id']} failed; tasks not successful: {bad}")
    dag_tasks = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/tasks")["tasks"]
    _, latency = http_json(f"{sandbox.url}/sandbox/latency")
    _, ops = http_json(f"{sandbox.url}/sandbox/operations")
    result = timeline(tis, dag_tasks, latency, ops["operations"])
    scaled = latency["scaled_seconds"]
    print(
        f"\nlatency scale {args.scale}: cluster create {scaled['container.clusters.create']:.0f} s, node pool "
        f"{scaled['container.nodePools.create']:.0f} s, Lustre {scaled['lustre.instances.create']:.0f} s"
    )
    print_tasks(result)
    print()
    return print_ratios(result, args.gate)


def main() -> int:
    """Run the bench; 0 when the gated ratios meet their targets, 1 when one misses, 2 when the bench failed."""
    args = parse_args()
    started = time.monotonic()
    return run_bench(
        "provision-makespan-", args.keep, lambda workdir, running: measure(args, workdir, started, running)
    )


if __name__ == "__main__":
    sys.exit(main())
