"""Many runs at once on one Airflow against one project: what they ask of Google's quotas, the leases and Airflow.

One sandbox (its latency model scaled by ``--scale``, Google's default rate quotas enforced: sandbox/quotas.py) and
the components ``airflow standalone`` runs (a real scheduler with the LocalExecutor and a real triggerer), on
127.0.0.1 only. The bench triggers, all at once, ``--provision`` runs that provision a whole run group (networks,
peering, Lustre, cluster, GPU pool) and tear it down (``stop_after=cluster``, ``delete_all``), and ``--train`` runs of
the local recipe that train on a real Ray (own RayCluster, job, checkpoint, export). Each run has names of its own,
so each is its own run group with its own lease.

It prints, per run and at the peak: Google API requests by API and method, the lease writes and their 412 retries
(fingerprint conflicts), the requests any 60 s window saw per quota group against the modelled default quotas, the
triggerer's CPU-seconds per deferred task-hour, and the Airflow components' peak memory; then the verdicts: every
run succeeded, no resource or lease of one group was touched by another run, lease 412 retries per write on average
(target <= 1), and no call refused by a rate quota. Exit 0 when all hold, 1 when one misses, 2 when the bench failed.

    .venv/bin/python bench/many_runs.py [--provision 16] [--train 4] [--scale 0.02] [--keep]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import (  # noqa: E402
    Airflow,
    component_pids,
    http_json,
    run_bench,
    run_path,
    start_airflow,
    task_instances,
    trigger,
    wait_for,
    wait_ready,
    xcom_value,
)
from bench.provision_makespan import SEED, when  # noqa: E402
from sandbox.testing import start_sandbox  # noqa: E402

from nemo_rl_gke.run import outcomes  # noqa: E402
from nemo_rl_gke.run import topology as t  # noqa: E402
from nemo_rl_gke.run.spec import RunSpec, default_conf  # noqa: E402

TARGET_412_PER_WRITE = 1.0
# Steps whose task waits deferred (their time in the triggerer): the GCP ensures and deletes, the kube and job waits.
DEFERRING = frozenset(
    [s.task_id for s in (*t.gcp_resources(), *t.teardown_steps())]
    + [t.RAYCLUSTER, t.WAIT, t.CHECK_CHECKPOINT, t.CONVERT, t.EXPORT, t.LUSTRE_STORAGE]
)
LEASE_WRITE = "/setCommonInstanceMetadata"


def names(n: int) -> dict[str, str]:
    """Names of run group ``n`` of its own (every parameter a run group is made of but the project and zone)."""
    base = RunSpec.from_conf(default_conf())
    return {
        "network": f"{base.network}-m{n:02d}",
        "gvnic_prefix": f"{base.gvnic_prefix}-m{n:02d}",
        "rdma_prefix": f"{base.rdma_prefix}-m{n:02d}",
        "lustre_name": f"{base.lustre_name}-m{n:02d}",
        "cluster_name": f"{base.cluster_name}-m{n:02d}",
        "raycluster_name": f"{base.raycluster_name}-m{n:02d}",
    }


def confs(provision: int, train: int, poll: float) -> list[tuple[str, dict[str, Any]]]:
    """The runs: each one's label and conf."""
    local = json.loads((ROOT / "include/conf/local.json").read_text())
    out = []
    for n in range(provision):
        conf = {"mode": "apply", "stop_after": t.CLUSTER, "teardown_policy": t.DELETE_ALL, "poll_interval_s": poll}
        out.append((f"provision-{n:02d}", {**conf, **names(n)}))
    for n in range(provision, provision + train):
        conf = {**local, "max_steps": 6, "eval_benchmark": "off", "publish": "always", "poll_interval_s": poll,
                "checkpoint_dir": f"/data/many_runs_{n:02d}", "zero_learning_guard": False}  # fmt: skip
        out.append((f"train-{n:02d}", {**conf, **names(n)}))
    return out


class Sampler:
    """Samples the Airflow components' memory and the triggerer's CPU time every second, in a thread."""

    def __init__(self, airflow: Airflow) -> None:
        import psutil

        self._psutil = psutil
        self.airflow = airflow
        self.peak_rss = 0
        self.triggerer_cpu = 0.0
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            total = 0
            for component in ("scheduler", "triggerer", "dag-processor", "api-server"):
                for pid in component_pids(self.airflow, component):
                    try:
                        process = self._psutil.Process(pid)
                        total += process.memory_info().rss
                        if component == "triggerer":
                            times = process.cpu_times()
                            self._seen[pid] = times.user + times.system
                    except self._psutil.Error:
                        continue
            self.peak_rss = max(self.peak_rss, total)
        self.triggerer_cpu = sum(self._seen.values())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def peak_per_minute(calls: list[dict[str, Any]], window_s: float = 60.0) -> dict[str, int]:
    """The most calls any ``window_s`` window saw (a minute, or a scaled run's minute), per quota group the sandbox
    models (compute reads and mutations, GKE)."""
    groups: dict[str, list[float]] = collections.defaultdict(list)
    for call in calls:
        if call["service"] == "compute":
            groups["compute.read" if call["method"] == "GET" else "compute.default"].append(call["time"])
        elif call["service"] == "container":
            groups["container.requests"].append(call["time"])
    peaks = {}
    for group, times in groups.items():
        times.sort()
        best, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] > window_s:
                first += 1
            best = max(best, last - first + 1)
        peaks[group] = best
    return peaks


def owner_of(text: str, labels: dict[str, str]) -> str:
    """The run whose group ``text`` names (suffixes end at a non-digit, so -m01 never takes -m010's), or "shared"."""
    for suffix, label in labels.items():
        at = text.find(suffix)
        while at >= 0:
            end = at + len(suffix)
            if end == len(text) or not text[end].isdigit():
                return label
            at = text.find(suffix, end)
    return "shared"


def attribute(calls: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """The run each call served: the group its path or body names, or, for a call on an operation, the run whose
    call started that operation. Project-level calls (the leases, regions, quotas) stay "shared"."""
    by_operation: dict[str, str] = {}
    owners = []
    for call in calls:
        # A lease write carries every group's lease: it is the project's, not a run's.
        text = call["path"] if call["path"].endswith(LEASE_WRITE) else call["path"] + " " + json.dumps(call.get("body"))
        owner = owner_of(text, labels)
        if owner == "shared":
            owner = next((by_operation[op] for op in by_operation if op in call["path"]), "shared")
        for op in call.get("operations") or ():
            by_operation[op.rsplit("/", 1)[-1]] = owner
        owners.append(owner)
    return owners


class Postgres:
    """A private PostgreSQL server for the bench's metadata DB, on 127.0.0.1 and a free port, with its data in the
    bench's temp dir. SQLite locks under twenty runs' schedulers, triggerers and task runners (a deployment runs
    PostgreSQL: docker-compose.yaml). Run as the ``postgres`` user when the bench runs as root (initdb refuses root).
    Needs Debian's postgresql and the psycopg2 driver (requirements-dev.txt)."""

    def __init__(self, workdir: Path) -> None:
        import os
        import pwd
        import shutil
        import subprocess

        from sandbox.ports import free_port

        found = shutil.which("pg_ctl") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
        if found is None:
            raise OSError("PostgreSQL's pg_ctl is not installed (apt-get install postgresql)")
        self.bin = Path(found).resolve().parent
        self.data = workdir / "pgdata"
        self.data.mkdir()
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            workdir.chmod(0o711)  # mkdtemp's 0700 would keep the postgres user out
            os.chown(self.data, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run = subprocess.run
        self._pg(["initdb", "-D", str(self.data), "-A", "trust", "-U", "airflow", "--no-sync"])
        settings = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.data} "
        settings += "-c max_connections=300 -c fsync=off"
        self._pg(["pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-o", settings, "start"])
        self._pg(["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "airflow"])
        self.url = f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    def _pg(self, command: list[str]) -> None:
        done = self._run([*self._as, str(self.bin / command[0]), *command[1:]], capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"{command[0]} failed: {done.stderr.strip()[-500:]}")

    def stop(self) -> None:
        """Stop the server (its data goes with the temp dir)."""
        self._pg(["pg_ctl", "-D", str(self.data), "-m", "fast", "stop"])


def measure(args: argparse.Namespace, workdir: Path, running: dict[str, Any]) -> bool:
    """Start everything, run the runs at once, print the figures and the verdicts."""
    seed = {**SEED, "reservations": [{**SEED["reservations"][0], "count": 4 * (args.provision + args.train)}]}
    sandbox = running["sandbox"] = start_sandbox(workdir / "sandbox", latency_scale=args.scale, seed=seed)
    total = args.provision + args.train
    # One deployment: every run may be active at once, and the GPU bound leaves room for all of them.
    postgres = running["postgres"] = Postgres(workdir)
    extra = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.url,
        "AIRFLOW__NEMO_RL_GKE__MAX_ACTIVE_RUNS": str(total),
        "AIRFLOW__NEMO_RL_GKE__MAX_GPU_NODES_TOTAL": str(8 * total),
        "AIRFLOW__CORE__PARALLELISM": "32",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "64",
    }
    airflow = running["airflow"] = start_airflow(workdir, sandbox.url, extra_env=extra)
    wait_ready(airflow, 180.0)
    print(f"sandbox {sandbox.url}; Airflow on 127.0.0.1:{airflow.port}; {args.provision} provisioning and "
          f"{args.train} training runs at once, latency scale {args.scale}", flush=True)  # fmt: skip
    runs = confs(args.provision, args.train, args.poll)
    started = time.time()
    with Sampler(airflow) as sampler:
        ids = {label: trigger(airflow, conf) for label, conf in runs}

        def all_done() -> bool:
            states = [airflow.api("GET", run_path(rid))["state"] for rid in ids.values()]
            return all(state in ("success", "failed") for state in states)

        wait_for("every run to finish", all_done, args.timeout, 5.0)
    ended = time.time()
    return judge(airflow, sandbox.url, runs=runs, ids=ids, sampler=sampler, started=started, ended=ended)


def judge(
    airflow: Airflow,
    sandbox_url: str,
    *,
    runs: list[tuple[str, dict[str, Any]]],
    ids: dict[str, str],
    sampler: Sampler,
    started: float,
    ended: float,
) -> bool:
    """Print the figures per run and at the peak, and the verdicts; whether they all hold."""
    _, log = http_json(f"{sandbox_url}/sandbox/calls")
    calls = [c for c in log["calls"] if started <= c["time"] <= ended + 5]
    _, rates = http_json(f"{sandbox_url}/sandbox/rates")
    labels = {f"-m{n:02d}": label for n, (label, _) in enumerate(runs)}
    per_run: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for call, owner in zip(calls, attribute(calls, labels), strict=True):
        per_run[owner][f"{call['service']} {call['method']}"] += 1
    ok, deferred_s = print_runs(airflow, ids, per_run, started, ended)
    writes = [c for c in calls if c["path"].endswith(LEASE_WRITE)]
    conflicts = sum(1 for c in writes if c["status"] == 412)
    done = len(writes) - conflicts
    per_write = conflicts / done if done else 0.0
    print(f"\nlease writes: {done} written, {conflicts} refused 412 (stale fingerprint): {per_write:.2f} retries per "
          f"write (target <= {TARGET_412_PER_WRITE})")  # fmt: skip
    limits = {name: group["limit"] * 60.0 / group["interval_s"] for name, group in rates["groups"].items()}
    print("peak requests in any 60 s window, per quota group (default quota per minute):")
    for group, peak in sorted(peak_per_minute(calls).items()):
        print(f"  {group}: {peak} ({limits.get(group, 0):.0f})")
    refused = rates["refused"]
    print(f"calls refused by a rate quota: {sum(r['refused'] for r in refused)}")
    hours = deferred_s / 3600.0
    print(f"triggerer: {sampler.triggerer_cpu:.1f} CPU-s over {hours:.2f} deferred task-hours = "
          f"{sampler.triggerer_cpu / hours if hours else 0:.1f} CPU-s per deferred task-hour")  # fmt: skip
    print(f"Airflow components' peak memory: {sampler.peak_rss / 2**20:.0f} MiB; wall time {ended - started:.0f} s")
    _, inventory = http_json(f"{sandbox_url}/sandbox/inventory")
    left = [r["name"] for r in inventory.get("resources", [])]
    print(f"resources left after teardown: {len(left)}")
    verdicts = {
        "every run succeeded, each in its own group": ok,
        f"lease 412 retries per write <= {TARGET_412_PER_WRITE}": per_write <= TARGET_412_PER_WRITE,
        "no call refused by a rate quota": not refused,
        "nothing left": not left,
    }
    for what, held in verdicts.items():
        print(f"{'OK' if held else 'MISSED'}: {what}")
    return all(verdicts.values())


def print_runs(
    airflow: Airflow,
    ids: dict[str, str],
    per_run: dict[str, collections.Counter[str]],
    started: float,
    ended: float,
) -> tuple[bool, float]:
    """One line per run (its state, time and requests); whether all succeeded in their own group, and the seconds
    their deferring tasks waited."""
    ok, deferred_s = True, 0.0
    print("\nper run: state, wall time, Google API requests by API and method (calls naming its group)")
    for label, rid in ids.items():
        run = airflow.api("GET", run_path(rid))
        tis = task_instances(airflow, rid)
        deferred_s += sum(float(ti.get("duration") or 0) for ti in tis if ti["task_id"] in DEFERRING)
        counts = per_run.get(label, collections.Counter())
        shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        took = (when(run["end_date"]) or ended) - (when(run["start_date"]) or started)
        print(f"  {label}: {run['state']} in {took:.0f} s; {sum(counts.values())} requests ({shown})")
        if run["state"] != "success":
            ok = False
            bad = {ti["task_id"]: ti["state"] for ti in tis if ti["state"] not in ("success", "skipped")}
            print(f"    not successful: {bad}")
            continue
        tries = {ti["task_id"]: int(ti.get("try_number") or 1) for ti in tis}
        retried = sorted(task for task, n in tries.items() if n > 1)
        if retried:
            print(f"    retried: {', '.join(f'{task} ({tries[task]} tries)' for task in retried)}")
        # Its own group: every resource it made, it created itself. Another run's would be adopted, or "exists" (the
        # group's marker) on a first try; a retry finds what its first try created.
        for step in t.gcp_resources():
            result = xcom_value(airflow, rid, step.task_id) if step.task_id in tries else None
            action = result.get("action") if result else None
            if action == outcomes.ADOPTED or (action == outcomes.EXISTS and tries[step.task_id] == 1):
                print(f"    {step.task_id}: {action} on its first try (expected created)")
                ok = False
    shared = per_run.get("shared", collections.Counter())
    print(f"  shared (the project's: lease reads and writes, regions, quotas; each cluster's Kubernetes API, whose "
          f"paths name no group): {sum(shared.values())} requests "
          f"({', '.join(f'{k} {v}' for k, v in sorted(shared.items()))})")  # fmt: skip
    return ok, deferred_s


def main() -> int:
    """Run the bench; 0 when every verdict holds, 1 when one misses, 2 when the bench failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provision", type=int, default=16, help="runs that provision and tear down (default 16)")
    parser.add_argument("--train", type=int, default=4, help="runs that train on a real Ray (default 4)")
    parser.add_argument("--scale", type=float, default=0.02, help="sandbox latency scale (default 0.02)")
    parser.add_argument("--poll", type=float, default=2.0, help="the runs' poll_interval_s (default 2.0)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for every run (default 3600)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home)")
    args = parser.parse_args()
    if args.provision < 0 or args.train < 0 or args.provision + args.train == 0:
        parser.error("--provision and --train must be >= 0, not both 0")
    return run_bench("many-runs-", args.keep, lambda workdir, running: measure(args, workdir, running))


if __name__ == "__main__":
    sys.exit(main())
