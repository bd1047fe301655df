"""Shared test setup: the package on sys.path (pyproject's pythonpath) and a private Airflow home per session.

AIRFLOW_HOME must be set before anything imports airflow, so it is set here, at collection time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.paths import ROOT

_HOME = Path(tempfile.mkdtemp(prefix="nemo-rl-gke-airflow-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)  # under tmpfs (make test), a leftover home holds RAM

os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__PARALLELISM"] = "4"


@pytest.fixture(autouse=True)
def _fresh_credentials() -> None:
    """Each test builds its own credentials: two tests may point the same connection at different token servers."""
    from nemo_rl_gke.gcp import credentials

    credentials.clear()


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the session's private metadata DB once (`airflow db migrate`, as a user would)."""
    airflow = Path(sys.executable).parent / "airflow"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)


# The files of whole runs (real Airflow, Ray, the sandbox), longest first, as `--durations` measured them. Under
# `--dist loadfile` each file is one unit of work, handed out in collection order; starting the long ones first keeps
# both workers busy to the end, instead of one finishing a whole-DAG file alone while the other idles (the Makefile
# passes --no-loadscope-reorder, which would otherwise put the files with the most tests first).
LONGEST_FIRST = (
    "tests/e2e/test_local_guide.py",
    "tests/browser/test_ui.py",
    "tests/e2e/test_nightly.py",
    "tests/e2e/test_train.py",
    "tests/e2e/test_recovery.py",
    "tests/e2e/test_capacity.py",
    "tests/gcp/test_rayjob.py",
    "tests/e2e/test_apply.py",
    "tests/gcp/test_kube.py",
    "tests/e2e/test_train_failures.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files of :data:`LONGEST_FIRST` first, in that order; every file keeps its own tests' order."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(ROOT).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=key)
