"""Parse time of each DAG file as a ratio to a minimal airflow.sdk DAG, measured side by side in one run.

Each sample is a fresh interpreter that runs one DAG file (imports included), the way a DAG processor's child
does; the files alternate so drift hits all alike. A sample is the CPU time of running the file (``process_time``),
not the wall time: on a shared machine the wall time of the same file varies several-fold with the load, which
would drown a few percent. Bytecode is cached under the run's own temporary directory (``PYTHONPYCACHEPREFIX``, even
when the environment says ``PYTHONDONTWRITEBYTECODE``), filled by a warm-up run of each file, so no sample pays for
compiling a module whose ``.pyc`` is missing or stale. Target: ratio <= 1.03 for every file.

On a loaded machine the CPU time of the same file still varies by several percent from run to run. ``--instructions``
counts the instructions each file executes under valgrind's callgrind instead (hash seed fixed): the same count for
the same code, whatever the load, at about 50 s a file.

    .venv/bin/python bench/parse_time.py [--runs 7] [--instructions]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.03
# The strictest baseline: airflow.sdk alone (no @task, which pulls in the standard provider's operators).
MINIMAL_DAG = """
from datetime import datetime

from airflow.sdk import DAG, BaseOperator


class Noop(BaseOperator):
    def execute(self, context):
        return None


with DAG("minimal", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    Noop(task_id="noop")
"""
TIMER = (
    "import runpy, sys, time; t = time.process_time(); ns = runpy.run_path(sys.argv[1]); "
    "assert any(type(v).__name__ == 'DAG' for v in ns.values()); print(time.process_time() - t)"
)


def sample(path: Path, env: dict[str, str]) -> float:
    """CPU seconds one fresh interpreter takes to import and run the DAG file."""
    out = subprocess.run([sys.executable, "-c", TIMER, str(path)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def instructions(path: Path, env: dict[str, str]) -> int:
    """Instructions one fresh interpreter executes to import and run the DAG file, counted by valgrind's callgrind
    (the same for the same inputs, whatever else the machine does; about 50 s a sample)."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", TIMER, str(path)]
    out = subprocess.run(command, env={**env, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count: {out.stderr[-500:]}")
    return int(found.group(1))


def main() -> int:
    """Print both medians and their ratio; exit 1 if the ratio misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under valgrind instead of timing (one run)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal_dag.py"
        minimal.write_text(MINIMAL_DAG)
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "AIRFLOW_HOME": str(Path(tmp) / "home"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": str(ROOT / "plugins"),
            "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache"),
        }
        ours = sorted((ROOT / "dags").glob("*.py"))
        for path in (minimal, *ours):
            sample(path, env)  # warm-up: writes airflow.cfg, compiles every module it imports, fills the page cache
        if args.instructions:
            return report_instructions(minimal, ours, env)
        base: list[float] = []
        times: dict[Path, list[float]] = {path: [] for path in ours}
        for _ in range(args.runs):
            base.append(sample(minimal, env))
            for path in ours:
                times[path].append(sample(path, env))
    b = statistics.median(base)
    print(f"minimal airflow.sdk DAG: median {b:.3f}s CPU over {args.runs} runs ({min(base):.3f}-{max(base):.3f})")
    missed = 0
    for path, samples in times.items():
        d = statistics.median(samples)
        ratio = d / b
        missed += ratio > TARGET
        print(
            f"dags/{path.name}: median {d:.3f}s ({min(samples):.3f}-{max(samples):.3f}), ratio {ratio:.3f} "
            f"(target <= {TARGET:.2f}): {'OK' if ratio <= TARGET else 'MISSED'}"
        )
    return 1 if missed else 0


def report_instructions(minimal: Path, ours: list[Path], env: dict[str, str]) -> int:
    """Each file's instruction count over the minimal DAG's; exit status 1 if a ratio misses the target."""
    base = instructions(minimal, env)
    print(f"minimal airflow.sdk DAG: {base:,} instructions")
    missed = 0
    for path in ours:
        count = instructions(path, env)
        ratio = count / base
        missed += ratio > TARGET
        print(f"dags/{path.name}: {count:,} instructions, ratio {ratio:.3f} (target <= {TARGET:.2f}): "
              f"{'OK' if ratio <= TARGET else 'MISSED'}")  # fmt: skip
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
