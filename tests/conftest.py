"""Shared test setup: the package on sys.path (pyproject's pythonpath) and a private Airflow home per session.

AIRFLOW_HOME must be set before anything imports airflow, so it is set here, at collection time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.paths import ROOT

_HOME = Path(tempfile.mkdtemp(prefix="nemo-rl-gke-airflow-"))

os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__PARALLELISM"] = "4"


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the session's private metadata DB once (`airflow db migrate`, as a user would)."""
    airflow = Path(sys.executable).parent / "airflow"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)
