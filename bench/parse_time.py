"""Parse time of the DAG file as a ratio to a minimal airflow.sdk DAG, measured side by side in one run.

Each sample is a fresh interpreter that runs one DAG file (imports included), the way a DAG processor's child
does; the two files alternate so drift on this shared machine hits both alike. Target: ratio <= 1.10.

    .venv/bin/python bench/parse_time.py [--runs 7] [--dag dags/nemo_rl_gke_sweeper.py]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.10
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
    "import runpy, sys, time; t = time.perf_counter(); ns = runpy.run_path(sys.argv[1]); "
    "assert any(type(v).__name__ == 'DAG' for v in ns.values()); print(time.perf_counter() - t)"
)


def sample(path: Path, env: dict[str, str]) -> float:
    """Seconds one fresh interpreter takes to import and run the DAG file."""
    out = subprocess.run([sys.executable, "-c", TIMER, str(path)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    """Print both medians and their ratio; exit 1 if the ratio misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dag", type=Path, default=ROOT / "dags" / "nemo_rl_grpo.py", help="the DAG file to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal_dag.py"
        minimal.write_text(MINIMAL_DAG)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(Path(tmp) / "home"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": str(ROOT / "plugins"),
        }
        ours = args.dag.resolve()
        sample(minimal, env)  # warm-up: writes airflow.cfg and fills the OS page cache
        sample(ours, env)
        base, dag = [], []
        for _ in range(args.runs):
            base.append(sample(minimal, env))
            dag.append(sample(ours, env))
    b, d = statistics.median(base), statistics.median(dag)
    ratio = d / b
    print(f"minimal airflow.sdk DAG: median {b:.3f}s over {args.runs} runs ({min(base):.3f}-{max(base):.3f})")
    print(f"{args.dag.name}: median {d:.3f}s over {args.runs} runs ({min(dag):.3f}-{max(dag):.3f})")
    print(f"ratio {ratio:.3f} (target <= {TARGET:.2f}): {'OK' if ratio <= TARGET else 'MISSED'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
