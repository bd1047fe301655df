"""What one lost GPU worker node costs a local run: the steps lost per save period, and the time to train again.

A whole local run (`airflow dags test`, the local CPU recipe, ``checkpointing.save_period`` S) against a fresh
sandbox. When the job's driver log begins step ``--lose-at-step``, the sandbox kills the RayCluster's worker node; its
node pool replaces it ``--replace-after-s`` seconds later (the modelled replacement time R). The DAG's recovery
resubmits the job from its newest save. Printed, measured side by side in the one run:

- the steps lost (finished after the newest save, trained again) divided by S (target <= 1.0);
- the seconds from the node's loss to the first step the new attempt finishes, divided by R (target <= 1.2), with
  the timeline in between: the failure seen, the node replaced, the resubmission, the new attempt's first step.

The driver logs are read from the sandbox Ray's session directory every 50 ms, so a time is at most that late.
Exit status: 0 when the run succeeded and both ratios meet their targets, 1 when not, 2 when the bench failed.

    AIRFLOW_HOME=... .venv/bin/python bench/recovery.py [--steps 30] [--save-period 5] [--lose-at-step 13]
        [--replace-after-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

# GKE repairs a node after about 10 minutes NotReady (cloud.google.com/kubernetes-engine/docs/how-to/node-auto-repair),
# so a minute is shorter than any real replacement: the fixed costs after it weigh more here than on GKE.
DEFAULT_REPLACEMENT_S = 60.0
STEPS_LOST_TARGET = 1.0
RECOVERY_TIME_TARGET = 1.2
_HEADER = re.compile(r"=+ Step (\d+)/\d+ =+")


class DriverLogWatch:
    """Times, from the driver logs of the run's Ray jobs, when each job began and finished its steps; and loses the
    worker node when the first job begins step ``lose_at``."""

    def __init__(self, sandbox: Any, lose_at: int, replace_after_s: float) -> None:
        self.sandbox, self.lose_at, self.replace_after_s = sandbox, lose_at, replace_after_s
        # submission id -> [(time, step, "begin" | "done")]
        self.events: dict[str, list[tuple[float, int, str]]] = {}
        self.loss: dict[str, Any] | None = None
        self.stop = threading.Event()
        self._read: dict[Path, int] = {}
        self._step: dict[Path, int] = {}

    def run(self) -> None:
        """Poll until stopped (a thread's target)."""
        heads: list[dict[str, Any]] = []
        looked = 0.0
        while not self.stop.is_set():
            if time.monotonic() - looked > 1.0:  # the heads change rarely; their logs are read every 50 ms
                heads = [h for h in self.sandbox.full_inventory()["ray_heads"] if h.get("driver_logs")]
                looked = time.monotonic()
            for head in heads:
                for path in sorted(Path(head["driver_logs"]).glob("job-driver-*.log")):
                    self._scan(path, head["raycluster"])
            self.stop.wait(0.05)

    def _scan(self, path: Path, raycluster: str) -> None:
        try:
            with path.open("rb") as log:
                log.seek(self._read.get(path, 0))
                chunk = log.read()
        except OSError:
            return
        # Whole lines only: the rest is read again next time.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._read[path] = self._read.get(path, 0) + len(complete)
        job = path.name.removeprefix("job-driver-").removesuffix(".log")
        now = time.time()
        for line in complete.decode(errors="replace").splitlines():
            if (m := _HEADER.search(line)) is not None:
                self._step[path] = int(m.group(1))
                self.events.setdefault(job, []).append((now, int(m.group(1)), "begin"))
                if self.loss is None and not job.endswith("-validate") and int(m.group(1)) == self.lose_at:
                    self.loss = self.sandbox.lose_node(raycluster, replace_after_s=self.replace_after_s)
            elif "Avg Reward" in line and path in self._step:
                self.events.setdefault(job, []).append((now, self._step[path], "done"))

    def first(self, job: str, kind: str) -> tuple[float, int] | None:
        """When job ``job`` first began (or finished) a step, and which."""
        return next(((at, step) for at, step, k in self.events.get(job, []) if k == kind), None)


def main() -> int:
    """One run, one node loss; print the two ratios and the timeline."""
    from sandbox.demo import latest_run, run_dags_test, start_demo_sandbox

    from nemo_rl_gke.run import topology

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-period", type=int, default=5)
    parser.add_argument("--lose-at-step", type=int, default=13)
    parser.add_argument("--replace-after-s", type=float, default=DEFAULT_REPLACEMENT_S)
    args = parser.parse_args()
    home = Path(os.environ["AIRFLOW_HOME"])
    conf = {
        **json.loads((ROOT / "include" / "conf" / "local.json").read_text()),
        "max_steps": args.steps,
        "extra_overrides": [f"checkpointing.save_period={args.save_period}"],
        "zero_learning_guard": False,
        "max_recoveries": 2,
    }
    sandbox, env = start_demo_sandbox(home, conf)
    watch = DriverLogWatch(sandbox, args.lose_at_step, args.replace_after_s)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    try:
        code = run_dags_test("nemo_rl_grpo_gke", json.dumps(conf), home / "logs" / "bench-recovery.log", env)
        losses = sandbox.node_losses()
    finally:
        watch.stop.set()
        thread.join(timeout=5)
        sandbox.stop()
    run = latest_run("nemo_rl_grpo_gke")
    recoveries = run["xcom"].get((topology.WAIT, topology.JOB_RECOVERIES)) or []
    if code != 0 or watch.loss is None or len(recoveries) != 1 or len(losses) != 1:
        print(
            f"the run did not recover from exactly one node loss: exit {code}, state {run['state']}, "
            f"{len(losses)} loss(es), {len(recoveries)} recovery(ies); see {home}/logs/bench-recovery.log"
        )
        return 2
    [recovery], [loss] = recoveries, losses
    resumed = watch.first(recovery["submission_id"], "begin")
    done = watch.first(recovery["submission_id"], "done")
    if resumed is None or done is None or loss.get("lost_at") is None:
        print(f"the new attempt {recovery['submission_id']} logged no step; see {home}/logs/bench-recovery.log")
        return 2
    lost_at = float(loss["lost_at"])
    lost_ratio = recovery["steps_lost"] / args.save_period
    recover_s = done[0] - lost_at
    time_ratio = recover_s / args.replace_after_s
    print(f"run {run['run_id']}: {run['state']}; recovery rule '{recovery['rule']}'")
    where = f"save period S={args.save_period}, replacement R={args.replace_after_s:.0f}s"
    print(f"\nnode lost during step {args.lose_at_step}, {where}")
    print(f"{'event':<44}{'after loss':>12}")
    timeline = [
        ("the failed attempt ended (Ray's end_time)", float(recovery["failed_at"])),
        ("the node pool replaced the node", float(loss["replaced_at"])),
        (
            f"resubmitted (attempt {recovery['attempt']}: its id ends -r{recovery['attempt']})",
            float(recovery["resubmitted_at"]),
        ),
        (f"the new attempt began step {resumed[1]}", resumed[0]),
        (f"the new attempt finished step {done[1]}", done[0]),
    ]
    for what, at in timeline:
        print(f"{what:<44}{at - lost_at:>+11.1f}s")
    print(
        f"\nsteps lost / S              {recovery['steps_lost']} / {args.save_period} = {lost_ratio:.2f}"
        f"   (target <= {STEPS_LOST_TARGET})"
    )
    print(
        f"loss to first new step / R  {recover_s:.1f}s / {args.replace_after_s:.0f}s = {time_ratio:.2f}"
        f"   (target <= {RECOVERY_TIME_TARGET})"
    )
    print(f"GPU-hours lost (report)     {recovery['gpu_hours_lost']}")
    met = lost_ratio <= STEPS_LOST_TARGET and time_ratio <= RECOVERY_TIME_TARGET
    return 0 if run["state"] == "success" and met else 1


if __name__ == "__main__":
    sys.exit(main())
