"""What each DAG file imports of the package while Airflow parses it, against an allowlist (issue #36).

Every scheduler parses every DAG file every 30 s, and Airflow 3's task runner parses it again at every task try: a
DAG file loads only what building the DAG needs, the rest loads when a task runs. Each file is run in a fresh
interpreter (the test process has imported everything already), and the ``nemo_rl_gke`` modules it loaded must be
exactly its allowlist, so a module that creeps back in shows, and so does one that is no longer needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

DAG_FILES = sorted((ROOT / "dags").glob("*.py"))

# Run in the child: the DAG file as Airflow's parser runs it, then every package module that is loaded.
CHILD = """
import runpy, sys
runpy.run_path(sys.argv[1])
print("\\n".join(sorted(m for m in sys.modules if m.split(".")[0] == "nemo_rl_gke")))
"""

# The manual run DAG: the factory, its operator classes, their extra links, the alert callbacks, the trigger form's
# Params and the docs. The rest are what those name at module level: the topology, the RunConf fields behind the
# Params (conf_schema, which reads the recipe names from paths), the alert settings, the deployment's config section
# with max_active_runs (airflow_settings), three small pure modules of names and rules (outcomes, task_states,
# capacity), and the Airflow names that moved between versions (airflow_compat: the operators' exceptions).
RUN_DAG = frozenset(
    {
        "nemo_rl_gke",
        "nemo_rl_gke.airflow_compat",
        "nemo_rl_gke.alerts",
        "nemo_rl_gke.dag_factory",
        "nemo_rl_gke.dag_params",
        "nemo_rl_gke.docs",
        "nemo_rl_gke.links",
        "nemo_rl_gke.operators",
        "nemo_rl_gke.operators.base",
        "nemo_rl_gke.operators.capacity",
        "nemo_rl_gke.operators.checkpoint",
        "nemo_rl_gke.operators.gcp",
        "nemo_rl_gke.operators.kube",
        "nemo_rl_gke.operators.lease",
        "nemo_rl_gke.operators.model_out",
        "nemo_rl_gke.operators.preflight",
        "nemo_rl_gke.operators.rayjob",
        "nemo_rl_gke.operators.report",
        "nemo_rl_gke.run",
        "nemo_rl_gke.run.airflow_settings",
        "nemo_rl_gke.run.alert_settings",
        "nemo_rl_gke.run.capacity",
        "nemo_rl_gke.run.conf_schema",
        "nemo_rl_gke.run.outcomes",
        "nemo_rl_gke.run.paths",
        "nemo_rl_gke.run.task_states",
        "nemo_rl_gke.run.times",
        "nemo_rl_gke.run.topology",
    }
)

ALLOWED: dict[str, frozenset[str]] = {
    "nemo_rl_grpo.py": RUN_DAG,
    # Each schedule file is read and its conf checked while the file is parsed: a bad one is this file's import error.
    "nemo_rl_grpo_schedules.py": RUN_DAG
    | {"nemo_rl_gke.run.schedules", "nemo_rl_gke.run.conf_checks", "nemo_rl_gke.run.findings"},
    # The sweep operator, the form's project Param (the run's own, so conf_schema) and the DAG's id (the sweeper's
    # runs hold leases: ownership); the sweep itself loads at run time.
    "nemo_rl_gke_sweeper.py": frozenset(
        {
            "nemo_rl_gke",
            "nemo_rl_gke.airflow_compat",
            "nemo_rl_gke.dag_params",
            "nemo_rl_gke.docs",
            "nemo_rl_gke.links",
            "nemo_rl_gke.operators",
            "nemo_rl_gke.operators.base",
            "nemo_rl_gke.operators.sweeper",
            "nemo_rl_gke.run",
            "nemo_rl_gke.run.airflow_settings",
            "nemo_rl_gke.run.conf_schema",
            "nemo_rl_gke.run.deployment",
            "nemo_rl_gke.run.ownership",
            "nemo_rl_gke.run.paths",
            "nemo_rl_gke.run.topology",
        }
    ),
}


def parse_time_modules(dag_file: Path, airflow_home: Path) -> set[str]:
    """The package modules loaded by running ``dag_file`` in a fresh interpreter, as the DAG processor would."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "plugins"),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(dag_file)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"{dag_file.name} did not parse:\n{result.stderr[-3000:]}"
    return set(result.stdout.split())


def test_every_dag_file_has_an_allowlist() -> None:
    assert sorted(ALLOWED) == [path.name for path in DAG_FILES]


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=[path.name for path in DAG_FILES])
def test_dag_file_imports_only_its_allowlist(dag_file: Path, tmp_path: Path) -> None:
    loaded = parse_time_modules(dag_file, tmp_path)
    allowed = ALLOWED.get(dag_file.name, frozenset())
    added, gone = sorted(loaded - allowed), sorted(allowed - loaded)
    assert not added and not gone, (
        f"dags/{dag_file.name} at parse time:\n"
        + "".join(f"  + {module} (imported, not in its allowlist)\n" for module in added)
        + "".join(f"  - {module} (in its allowlist, no longer imported)\n" for module in gone)
        + "Fix: a module only a task needs is imported inside the function that uses it, with the reason above it "
        "(`# lazy: execution-only, kept out of DAG parsing`), and names only annotations need go under "
        "`if TYPE_CHECKING:`; `PYTHONPATH=plugins python -X importtime dags/"
        f"{dag_file.name}` shows which module pulls it in. If building the DAG truly needs it, add it to ALLOWED in "
        "tests/dags/test_parse_imports.py; remove one that is no longer imported."
    )
