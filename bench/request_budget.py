"""A run's request budget: what one whole run asks of the APIs, and what training for 7 days adds over 1 hour.

One real run of the local recipe on a real Airflow (the components ``airflow standalone`` runs) against the sandbox,
provisioning, training, validating, exporting and tearing down everything. The sandbox's operations take the real
APIs' durations times ``--scale`` (sandbox/operations.py), and the run polls at 15 s times the same scale, so it
makes the operation polls a real run makes. Every call the sandbox answered is counted by API and method; the Ray Jobs
API's calls (through the GKE API server's service proxy) are counted apart.

What training longer adds is the Ray job trigger's status polls: the log arrives on one websocket and its end brings
the status (triggers/rayjob.py), so the polls follow ``RayJobTrigger._poll_delay``, replayed here on the trigger itself
over 1 hour and 7 days of training. Nothing else in a run depends on how long it trains (its lease is renewed once, past
the job's timeout). Target: the 7-day run's requests over the 1-hour run's <= 3.

It also prints the run's busiest minute per quota group the sandbox models (scaled back to real minutes), and how
many runs at that peak at once each default quota carries.

    .venv/bin/python bench/request_budget.py [--scale 0.05] [--keep]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import (  # noqa: E402
    http_json,
    run_bench,
    start_airflow,
    trigger,
    wait_ready,
    wait_run,
)
from bench.many_runs import peak_per_minute  # noqa: E402
from bench.provision_makespan import SEED  # noqa: E402
from sandbox.testing import start_sandbox  # noqa: E402

from nemo_rl_gke.triggers.rayjob import RayJobTrigger  # noqa: E402

TARGET = 3.0
HOUR = 3600.0
POLL_S = 15.0  # the conf's default poll_interval_s
RAY_JOBS = "/proxy/api/jobs"


def status_polls(training_s: float, poll_s: float = POLL_S) -> int:
    """The status polls of a job that trains ``training_s`` seconds, on the trigger's own schedule (a live log
    stream; no deadline nearer than the job's timeout, twice the training), plus the one its stream's end brings."""
    begin = 1_000_000.0
    job = RayJobTrigger(
        address="http://127.0.0.1:1", submission_id="job", poll_interval=poll_s, started_at=begin,
        timeout=2 * training_s, stall_after_s=training_s,
    )  # fmt: skip
    at, polls = begin, 1
    while at < begin + training_s:
        at += job._poll_delay(at)
        polls += 1
    return polls


def kind(call: dict[str, Any]) -> str:
    """The call's API and method, the Ray Jobs API's apart (status, log tail, log download, submit, stop)."""
    path = call["path"]
    if RAY_JOBS in path:
        tail = path.split(RAY_JOBS, 1)[1]
        what = "tail" if tail.endswith("/logs/tail") else "logs" if tail.endswith("/logs") else "jobs"
        return f"ray {what} {call['method']}"
    return f"{call['service']} {call['method']}"


def measure(args: argparse.Namespace, workdir: Path, running: dict[str, Any]) -> bool:
    """One whole run; print its requests, the 1-hour and 7-day budgets, the peak minute and the verdict."""
    sandbox = running["sandbox"] = start_sandbox(workdir / "sandbox", latency_scale=args.scale, seed=SEED)
    airflow = running["airflow"] = start_airflow(workdir, sandbox.url)
    wait_ready(airflow, 180.0)
    conf = json.loads((ROOT / "include/conf/local.json").read_text())
    conf.update({"max_steps": 6, "eval_benchmark": "off", "publish": "always", "poll_interval_s": POLL_S * args.scale})
    print(f"one run of the local recipe, sandbox latencies x{args.scale}, polls every {POLL_S * args.scale:.2f} s")
    started = time.time()
    run = wait_run(airflow, trigger(airflow, conf), args.timeout)
    ended = time.time()
    _, log = http_json(f"{sandbox.url}/sandbox/calls")
    calls = [c for c in log["calls"] if started <= c["time"] <= ended]
    counts = collections.Counter(kind(c) for c in calls)
    print(f"run {run['state']}; {len(calls)} requests in {ended - started:.0f} s:")
    for api, count in sorted(counts.items()):
        print(f"  {api}: {count}")
    polls_here = counts["ray jobs GET"]
    fixed = len(calls) - polls_here - counts["ray logs GET"]
    hour, week = status_polls(HOUR), status_polls(7 * 24 * HOUR)
    print(f"\nindependent of training time: {fixed} requests (all but the job's status polls and log downloads)")
    print(f"job status polls (Ray Jobs API, through the GKE API server): 1 h {hour}, 7 days {week}")
    one, seven = fixed + hour, fixed + week
    ratio = seven / one
    print(f"a run that trains 1 h: {one} requests; 7 days: {seven}; ratio {ratio:.2f} (target <= {TARGET})")
    _, rates = http_json(f"{sandbox.url}/sandbox/rates")
    limits = {name: group["limit"] * 60.0 / group["interval_s"] for name, group in rates["groups"].items()}
    print("busiest real minute per quota group (requests; default quota a minute; runs at this peak it carries):")
    for group, peak in sorted(peak_per_minute(calls, 60.0 * args.scale).items()):
        limit = limits.get(group, 0.0)
        print(f"  {group}: {peak} ({limit:.0f}; {int(limit // peak) if peak else 0})")
    held = run["state"] == "success" and ratio <= TARGET
    print(f"{'OK' if held else 'MISSED'}: the run succeeded and 7 days cost {ratio:.2f}x the requests of 1 hour")
    return held


def main() -> int:
    """Run the bench; 0 when the verdict holds, 1 when it misses, 2 when the bench failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.05, help="sandbox latency and poll scale (default 0.05)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the run (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home)")
    args = parser.parse_args()
    return run_bench("request-budget-", args.keep, lambda workdir, running: measure(args, workdir, running))


if __name__ == "__main__":
    sys.exit(main())
