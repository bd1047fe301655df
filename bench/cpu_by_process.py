"""Where a command's CPU goes, by kind of process: what the test suite spends its cores on.

On the 2-core CI machine the suite is CPU-bound (load average 8-11 at 3 workers), so its wall time follows the CPU
time of everything it starts: pytest's workers, Airflow's components and task processes, the sandbox, every Ray
process of every RayCluster, the local recipe's jobs, Chromium. Many of them outlive no parent a profiler could
attach to (Ray's daemons detach from ``ray start``), so this samples ``/proc`` instead: every process whose
environment carries this run's marker (:data:`MARKER`, set for the command; detached daemons inherit it too, other
work on the machine does not), or whose parent is counted (Ray's dashboard modules retitle themselves over their
environment), its user + system CPU time at the last sample it was seen alive. A process that lives less than one
interval can be missed; its CPU then shows nowhere (the parent's "children" times are not added, which would count
the same seconds twice).

    .venv/bin/python bench/cpu_by_process.py [--interval 0.5] [--top 25] -- COMMAND...

For instance ``-- .venv/bin/python -m pytest -q tests/browser/test_ui.py`` (run it with ``env -u
PYTHONDONTWRITEBYTECODE`` outside make, as README says). It prints one row per kind: CPU seconds, share, processes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
MARKER = "CPU_BY_PROCESS_RUN"
TICKS = os.sysconf("SC_CLK_TCK")
# (pattern on the command line, kind), first match wins: the Airflow and Ray components by name, then the sandbox's
# and the local recipe's processes, then the test runner. A process matching none is shown by its command's start.
KINDS: tuple[tuple[str, str], ...] = (
    (r"airflow (scheduler|triggerer|dag-processor)", "airflow {0}"),
    (r"airflow api_server", "airflow api-server"),
    (r"airflow worker", "airflow task processes"),
    (r"airflow dags test", "airflow dags test (CLI)"),
    (r"bin/airflow ", "airflow CLI (other)"),
    (r"multiprocessing\.forkserver.*airflow", "airflow forkserver"),
    (r"ray-dashboard|ray/dashboard/dashboard\.py|multiprocessing\.forkserver.*'ray'", "ray dashboard"),
    (r"^ray::(\w+)", "ray::{0}"),
    (r"(raylet|gcs_server)\b", "ray {0}"),
    (r"log_monitor\.py|autoscaler/_private/monitor\.py|ray\.util\.client\.server", "ray monitors and client server"),
    (r"bin/ray start|sandbox\.ray_node", "ray start (head and worker nodes)"),
    (r"grpo_cpu\.py", "local recipe: training"),
    (r"run_eval\.py", "local recipe: evaluation"),
    (r"convert_to_hf\.py", "local recipe: conversion"),
    (r"-m remote ", "checkpoint validator"),
    (r"-m sandbox (serve|auth-plugin|credentials)", "sandbox {0}"),
    (r"chromium|playwright/driver", "chromium and playwright"),
    (r"kubectl", "kubectl"),
    (r"-m pytest|xdist|exec\(eval\(sys\.stdin", "pytest (runner and workers)"),
)


@dataclass
class Seen:
    """One process as last seen: its command line and CPU seconds."""

    command: str
    cpu_s: float


def _stat(pid: str) -> tuple[float, str, str] | None:
    """(CPU seconds, start time in ticks, parent pid) of a process, or None once it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, fields[19], fields[1]


def _command(pid: str) -> str:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _carries(pid: str, marker: bytes) -> bool:
    """Whether the process's environment holds this run's marker."""
    try:
        return marker in (PROC / pid / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def sample(seen: dict[tuple[str, str], Seen], others: set[tuple[str, str]], marker: bytes) -> None:
    """Update ``seen`` with every live process of this run; ``others`` remembers the ones that are not. Lower pids
    first, so a parent is decided before the children it started since the last sample."""
    counted = {pid for pid, _ in seen}
    for pid in sorted((e.name for e in os.scandir(PROC) if e.name.isdigit()), key=int):
        stat = _stat(pid)
        if stat is None:
            continue
        key = (pid, stat[1])
        if key in others:
            continue
        if key not in seen and stat[2] not in counted and not _carries(pid, marker):
            others.add(key)
            continue
        counted.add(pid)
        # A zombie has no command line left: keep the one seen while it ran.
        command = _command(pid) or (seen[key].command if key in seen else "")
        seen[key] = Seen(command, stat[0])


def kind_of(command: str) -> str:
    """The row a process is counted in."""
    for pattern, kind in KINDS:
        match = re.search(pattern, command)
        if match:
            return kind.format(*match.groups())
    return command[:60] or "(exited before its command line was read)"


def table(seen: dict[tuple[str, str], Seen], top: int) -> list[str]:
    """The rows, most CPU first, and the total."""
    cpu: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for process in seen.values():
        kind = kind_of(process.command)
        cpu[kind] += process.cpu_s
        count[kind] += 1
    total = sum(cpu.values())
    rows = [f"{'CPU s':>9}  {'share':>6}  {'procs':>5}  kind"]
    for kind, seconds in cpu.most_common(top):
        rows.append(f"{seconds:9.1f}  {100 * seconds / (total or 1):5.1f}%  {count[kind]:5d}  {kind}")
    rows.append(f"{total:9.1f}  100.0%  {len(seen):5d}  total")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples of /proc")
    parser.add_argument("--top", type=int, default=25, help="rows to print")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    token = f"{os.getpid()}-{time.time_ns()}"
    marker = f"{MARKER}={token}".encode()
    seen: dict[tuple[str, str], Seen] = {}
    others: set[tuple[str, str]] = set()
    started = time.monotonic()
    process = subprocess.Popen(command, env={**os.environ, MARKER: token})
    while process.poll() is None:
        sample(seen, others, marker)
        time.sleep(args.interval)
    sample(seen, others, marker)
    wall = time.monotonic() - started
    rows = table(seen, args.top)
    total = sum(p.cpu_s for p in seen.values())
    print("\n".join(rows))
    print(
        f"wall {wall:.1f} s, {total / wall:.2f} cores busy on average (of {os.cpu_count()}); exit {process.returncode}"
    )
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
