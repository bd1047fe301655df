"""Worker-slot seconds spent while waiting: how much of the run's waiting holds an executor slot (target <= 0.02).

DESIGN rule 3: every wait on a long-running operation, the RayCluster or the Ray job defers to the triggerer, so no
worker slot is held while Google, Kubernetes or the job works. This bench runs the real DAG on a real scheduler
(LocalExecutor) and triggerer against the sandbox, then reads every task's log files from the private AIRFLOW_HOME:

- a task's *worker segments* are its processes on a worker slot: each starts with the task runner's
  ``::group::Pre Execute`` line and ends with the process's last line (execute, or execute_complete after a resume);
- a *wait* starts when the task hands itself to the triggerer (``Pausing task as DEFERRED``) and ends when its trigger
  fires (``Trigger fired event`` in the triggerer's log file of that try): the operation is in flight all along;
- a *waiting task* is one that deferred, or one of the steps that wait by design (ensure/delete a GCP resource, the
  RayCluster, the job, the checkpoint) that did not and still ran longer than ``SYNC_WAIT_MIN_S``: such a step
  waited on a slot, so its whole running time counts as both waiting and slot time (a regression to a synchronous
  wait shows up at once). Shorter ones found nothing to wait for (skipped, kept by policy, already gone).

ratio = (slot seconds inside the waits + running seconds of waiting steps that waited without deferring)
        / (wall seconds of the waits + running seconds of waiting steps that waited without deferring).

What a deferral itself costs on the slot (the worker's post-execute bookkeeping after it asked to defer) counts, so
the ratio falls as waits get longer: with the sandbox's latency model at ``--scale 0.25`` (cluster 105 s, Lustre
150 s) the waits are minutes, as on GKE they are tens of minutes. Exit status: 0 when the ratio meets the target, 1
when it misses, 2 when the bench failed. Everything it starts is stopped on exit.

    .venv/bin/python bench/worker_slots.py [--scale 0.25] [--steps 60] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import AirflowStartError, running_airflow, trigger, wait_run  # noqa: E402
from sandbox.demo import start_demo_sandbox  # noqa: E402
from sandbox.testing import SandboxError, set_latency  # noqa: E402

from nemo_rl_gke.run import topology  # noqa: E402
from nemo_rl_gke.run.topology import Op  # noqa: E402

TARGET = 0.02
DAG_ID = "nemo_rl_grpo_gke"
# Steps that exist to wait on something outside Airflow.
WAITING_OPS = frozenset({Op.ENSURE_GCP, Op.DELETE_GCP, Op.FOLLOW_JOB, Op.VALIDATE_CHECKPOINT, Op.EXPORT_CHECKPOINT})
WAITING_STEPS = frozenset({topology.RAYCLUSTER, topology.DELETE_RAYCLUSTER})
# A waiting step that did not defer but ran longer than this held its slot through a wait; a shorter one found
# nothing to wait for (skipped, kept by policy, already gone) after the ~2 s every task process spends starting.
SYNC_WAIT_MIN_S = 10.0
SEGMENT_START = "::group::Pre Execute"
DEFERRED = "Pausing task as DEFERRED"
FIRED = "Trigger fired event"
# What a teardown step logs when it keeps its resource (StepOperator.keep): it then ends skipped, with nothing waited.
KEPT = "Kept ("


@dataclass
class TaskWaits:
    """One task instance try, read from its log files."""

    task_id: str
    segments: list[tuple[float, float]] = field(default_factory=list)  # worker processes: (first, last line)
    waits: list[tuple[float, float]] = field(default_factory=list)  # (asked to defer, trigger fired)
    kept: bool = False  # a teardown step that kept its resource: it waited on nothing

    @property
    def running_s(self) -> float:
        """Seconds on a worker slot (every segment)."""
        return sum(end - start for start, end in self.segments)

    @property
    def wait_s(self) -> float:
        """Wall seconds of its waits."""
        return sum(end - start for start, end in self.waits)

    @property
    def slot_in_waits_s(self) -> float:
        """Seconds a worker process of this task ran while one of its waits was going on."""
        return sum(
            max(0.0, min(end, w_end) - max(start, w_start))
            for start, end in self.segments
            for w_start, w_end in self.waits
        )


def _lines(path: Path) -> list[tuple[float, str]]:
    """(epoch seconds, event) of every JSON line of a task log file."""
    out = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(raw)
            at = datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        out.append((at, str(record.get("event", ""))))
    return out


def read_try(task_dir: Path, attempt: Path) -> TaskWaits:
    """Segments and waits of one try from its worker log and its triggerer log(s)."""
    task = TaskWaits(task_dir.name.removeprefix("task_id="))
    worker = _lines(attempt)
    task.kept = any(event.startswith(KEPT) for _, event in worker)
    for at, event in worker:
        if event.startswith(SEGMENT_START) or not task.segments:
            task.segments.append((at, at))
        else:
            task.segments[-1] = (task.segments[-1][0], at)
    fired = sorted(
        at for path in task_dir.glob(f"{attempt.name}.trigger.*.log") for at, event in _lines(path) if FIRED in event
    )
    starts = [start for start, _ in task.segments]
    for at, event in worker:
        if DEFERRED in event:
            # The wait ends when the trigger fired; without that line, when the next worker process started.
            end = next((f for f in fired if f >= at), None) or next((s for s in starts if s > at), None)
            if end is not None:
                task.waits.append((at, end))
    return task


def read_run(logs: Path, run_id: str) -> list[TaskWaits]:
    """Every try of every task of the run."""
    run_dir = logs / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    tries = []
    for task_dir in sorted(run_dir.glob("task_id=*")):
        for attempt in sorted(task_dir.glob("attempt=*.log")):
            if re.fullmatch(r"attempt=\d+\.log", attempt.name):  # not the triggerer's attempt=N.log.trigger.M.log
                tries.append(read_try(task_dir, attempt))
    return tries


def waits_by_design(task_id: str) -> bool:
    """Whether the step exists to wait on something outside Airflow."""
    step = topology.STEPS.get(task_id)
    return step is not None and (step.op in WAITING_OPS or task_id in WAITING_STEPS)


def ratio(tries: list[TaskWaits]) -> tuple[float, float, float, list[str]]:
    """(ratio, slot seconds, wait seconds, the waiting steps that never deferred)."""
    slot = wall = 0.0
    synchronous = []
    for task in tries:
        if task.waits:
            slot += task.slot_in_waits_s
            wall += task.wait_s
        elif waits_by_design(task.task_id) and not task.kept and task.running_s > SYNC_WAIT_MIN_S:
            synchronous.append(task.task_id)
            slot += task.running_s
            wall += task.running_s
    return (slot / wall if wall else 0.0), slot, wall, synchronous


def report(tries: list[TaskWaits]) -> bool:
    """Print the per-task table and the ratio; True when it meets the target."""
    print(f"{'task':<32}{'waits':>6}{'wait s':>9}{'slot s':>9}{'in waits':>10}")
    for task in sorted(tries, key=lambda t: -t.wait_s):
        if task.waits or waits_by_design(task.task_id):
            print(
                f"{task.task_id:<32}{len(task.waits):>6}{task.wait_s:>9.1f}{task.running_s:>9.1f}"
                f"{task.slot_in_waits_s:>10.2f}"
            )
    value, slot, wall, synchronous = ratio(tries)
    print("(wait s: asked to defer -> trigger fired; slot s: every worker process of the task; in waits: the part")
    print(" of those processes that overlapped its waits)")
    if synchronous:
        print(f"waited on a worker slot without deferring: {', '.join(synchronous)}")
    waits = sum(len(t.waits) for t in tries)
    print(f"\nwaits {waits}, wall time of the waits {wall:.1f} s, worker-slot seconds in them {slot:.2f} s")
    met = value <= TARGET
    print(
        f"worker-slot seconds / wall time of the waits = {value:.4f}  (target <= {TARGET})  {'OK' if met else 'MISSED'}"
    )
    return met


def measure(args: argparse.Namespace, workdir: Path) -> bool:
    """Start the sandbox and Airflow, run the local conf in apply mode, read the logs, print; pass?"""
    conf = json.loads((ROOT / "include/conf/local.json").read_text())
    conf.update({"max_steps": args.steps, "zero_learning_guard": False, "poll_interval_s": args.poll_interval})
    if args.quick:
        conf.update({"stop_after": topology.CLUSTER, "teardown_policy": topology.KEEP_ALL})
    sandbox, env = start_demo_sandbox(workdir, conf)
    try:
        set_latency(sandbox.url, scale=args.scale)
        print(f"sandbox {sandbox.url} (latency scale {args.scale})", flush=True)
        with running_airflow(workdir, sandbox.url, env) as airflow:
            run_id = trigger(airflow, conf)
            print(f"run {run_id}: {'provisioning only' if args.quick else f'{args.steps} steps'}", flush=True)
            run = wait_run(airflow, run_id, args.run_timeout)
            print(f"run {run['state']}", flush=True)
            tries = read_run(airflow.home / "logs", run_id)
    finally:
        sandbox.stop()
    if not tries:
        raise AirflowStartError("no task logs found")
    return report(tries)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.25, help="sandbox latency scale (default 0.25)")
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps of the local recipe (default 60)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the run's poll_interval_s (default 1)")
    parser.add_argument("--run-timeout", type=float, default=1500.0, help="seconds for the run (default 1500)")
    parser.add_argument(
        "--quick", action="store_true", help="provisioning only, latency scale 0.02: the smallest run (for tests)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home)")
    args = parser.parse_args()
    if args.quick:
        args.scale = min(args.scale, 0.02)
    return args


def main() -> int:
    """0 when the ratio meets the target, 1 when it misses, 2 when the bench failed."""
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="worker-slots-"))
    started = time.monotonic()

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    try:
        return 0 if measure(args, workdir) else 1
    except (AirflowStartError, SandboxError, OSError, KeyboardInterrupt) as exc:
        print(f"bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"bench wall time {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
