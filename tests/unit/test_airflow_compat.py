"""The Airflow names that moved between 3.1 and 3.3 come from ``nemo_rl_gke.airflow_compat`` only, and each of its
fallbacks works. Runs on both ends: the main venv (3.3.2) and the floor's (3.1.0, ``make test-floor``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

COMPAT = ROOT / "plugins" / "nemo_rl_gke" / "airflow_compat.py"
# Every name the compat module exists for: imported from anywhere else, it breaks one end of the supported range.
MOVED = frozenset(
    {
        "AirflowException",
        "AirflowFailException",
        "AirflowSkipException",
        "AsyncCallback",
        "DeadlineAlert",
        "DeadlineReference",
        "TaskInstanceKey",
        "get_async_connection",
        "get_async_extra_dejson",
        "redact",
    }
)


def moved_imports(path: Path) -> list[str]:
    """Each import of a moved name from an Airflow module in ``path``, and each ``TaskGroup(..., doc_md=...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "airflow":
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}" for a in node.names if a.name in MOVED
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "TaskGroup"
            and any(k.arg == "doc_md" for k in node.keywords)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} TaskGroup(doc_md=...)")
    return found


def test_a_moved_name_is_imported_from_the_compat_module_only() -> None:
    files = [p for folder in ("plugins", "dags") for p in (ROOT / folder).rglob("*.py") if p != COMPAT]
    elsewhere = [hit for path in files for hit in moved_imports(path)]
    assert not elsewhere, "import these from nemo_rl_gke.airflow_compat:\n" + "\n".join(elsewhere)
    # The scan sees what it looks for: the compat module itself imports the moved names.
    own = " ".join(moved_imports(COMPAT))
    assert all(name in own for name in ("exceptions.AirflowFailException", "get_async_connection", "TaskGroup(doc_md"))


def test_a_task_group_takes_its_docs_where_this_airflow_shows_them() -> None:
    from airflow.sdk import DAG, TaskGroup

    from nemo_rl_gke.airflow_compat import task_group

    with DAG("compat_groups", schedule=None):
        group = task_group("g", tooltip="what it does", doc_md="**If it fails**: retry")
    assert group.tooltip == "what it does"
    shows_docs = "doc_md" in TaskGroup.__init__.__code__.co_varnames or hasattr(group, "doc_md")
    assert getattr(group, "doc_md", None) == ("**If it fails**: retry" if shows_docs else None)


# Run in a child with common-compat's connection module hidden, as on Composer's common-compat 1.7.
OLD_COMMON_COMPAT = """
import asyncio, sys
sys.modules["airflow.providers.common.compat.connection"] = None
from nemo_rl_gke import airflow_compat
assert airflow_compat.get_async_connection.__module__ == "nemo_rl_gke.airflow_compat"
conn = asyncio.run(airflow_compat.get_async_connection("compat_probe"))
extras = asyncio.run(airflow_compat.get_async_extra_dejson(conn))
print("probe:", conn.host, conn.password, extras["project"])
"""


def test_without_common_compat_s_async_reads_the_connection_is_read_in_a_thread() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT}",
        "AIRFLOW_CONN_COMPAT_PROBE": '{"conn_type": "http", "host": "h.example", "password": "pw", '
        '"extra": {"project": "p1"}}',
    }
    child = subprocess.run(
        [sys.executable, "-c", OLD_COMMON_COMPAT], env=env, capture_output=True, text=True, check=False, timeout=120
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.splitlines()[-1].split() == ["probe:", "h.example", "pw", "p1"]


def test_redact_masks_what_mask_secret_was_given() -> None:
    from airflow.sdk.log import mask_secret

    from nemo_rl_gke.airflow_compat import redact

    mask_secret("compat-probe-secret-0123456789")
    assert redact("token compat-probe-secret-0123456789 refused") == "token *** refused"


def test_the_declared_range_is_the_tested_one() -> None:
    """pyproject's range starts at the floor CI tests and admits the version the demo and whole runs use."""
    import tomllib

    from packaging.requirements import Requirement

    (declared,) = [
        Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]

    def pin(file: str) -> str:
        (line,) = [x for x in (ROOT / file).read_text().splitlines() if x.startswith("apache-airflow==")]
        return line.split("==")[1]

    assert declared.name == "apache-airflow"
    assert f">={pin('requirements-floor.txt')}" in {str(s) for s in declared.specifier}
    assert declared.specifier.contains(pin("requirements.txt")) and declared.specifier.contains(
        pin("requirements-floor.txt")
    )
