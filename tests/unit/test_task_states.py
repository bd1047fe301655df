"""Airflow's task states are written once (nemo_rl_gke.run.task_states), in Airflow's own words."""

from __future__ import annotations

import ast

from airflow.utils.state import DagRunState, TaskInstanceState

from nemo_rl_gke.run import task_states as ts
from tests.paths import ROOT

AIRFLOW_WORDS = {s.value for s in TaskInstanceState} | {ts.NONE}
HOME = ROOT / "plugins/nemo_rl_gke/run/task_states.py"


def test_every_word_is_airflow_s_and_the_sets_fit_together() -> None:
    words = {v for k, v in vars(ts).items() if k.isupper() and isinstance(v, str)}
    assert words <= AIRFLOW_WORDS and len(words) == len(
        [k for k, v in vars(ts).items() if k.isupper() and isinstance(v, str)]
    )
    for name in ("FAILED_STATES", "ENDED", "ACTIVE", "AT_WORK", "NOT_RUN", "MADE", "SEVERITY"):
        assert set(getattr(ts, name)) <= AIRFLOW_WORDS, name
    assert {s.value for s in DagRunState} >= ts.ACTIVE_RUNS
    assert ts.FAILED_STATES <= ts.ENDED and not ts.ENDED & set(ts.ACTIVE)
    assert set(ts.ACTIVE) >= ts.AT_WORK and len(set(ts.ACTIVE)) == len(ts.ACTIVE)
    # Every state has a severity; Airflow's human-in-the-loop state (no step of a run waits for input) ranks as an
    # unknown one, just after upstream_failed (3.1.0 has no such state). A state a new Airflow adds shows up here.
    assert len(set(ts.SEVERITY)) == len(ts.SEVERITY)
    assert AIRFLOW_WORDS - set(ts.SEVERITY) == AIRFLOW_WORDS & {"awaiting_input"}
    assert ts.severity("awaiting_input") == ts.severity("something-new") == ts.UNKNOWN_SEVERITY
    assert ts.severity(ts.FAILED) < ts.severity(ts.UPSTREAM_FAILED) < ts.severity("x") < ts.severity(ts.SUCCESS)


def _state_collections(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """Set, tuple and list literals, and dicts keyed by states only, that hold two or more task-state words."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
            if any(not (isinstance(k, ast.Constant) and k.value in AIRFLOW_WORDS) for k in items):
                continue  # a mapping keyed by states only (a JSON body may have a "failed" field)
        else:
            continue
        words = [e.value for e in items if isinstance(e, ast.Constant) and e.value in AIRFLOW_WORDS]
        if len(words) >= 2:
            found.append((node.lineno, words))
    return found


def test_no_module_writes_out_a_set_of_task_states_of_its_own() -> None:
    offenders = []
    for path in [*(ROOT / "plugins").rglob("*.py"), *(ROOT / "dags").rglob("*.py")]:
        if path != HOME:
            for line, words in _state_collections(ast.parse(path.read_text())):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {words}")
    assert offenders == []
    # The check itself can fail: it finds each kind of copy it is meant to find.
    planted = ast.parse(
        'A = frozenset({"failed", "upstream_failed"}); s in ("running", "deferred"); B = {"success": 1, "failed": 2}'
    )
    assert sorted(words for _, words in _state_collections(planted)) == [
        ["failed", "upstream_failed"],
        ["running", "deferred"],
        ["success", "failed"],
    ]
