"""Three nights of a schedule on the sandbox, through real Airflow (``dag.test`` at each night's logical date) and a
real Ray: a cold night whose model is published, a warm night that creates nothing, resumes, and is not promoted (a
successful run, an alert, no published-model event), and a night after Lustre was deleted that resumes from the last
promoted model (``resume=promoted``), imported from Cloud Storage. Between them, a night that finds the group held
touches nothing.

The schedule is tests/fixtures/schedules/nightly-local.yaml: the local CPU recipe, 3 more steps a night, the cluster
and Lustre kept warm (its GPU pool scaled to 0 nodes).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.schedules import load_schedule
from nemo_rl_gke.run.spec import RunSpec, default_conf
from tests.e2e.harness import run_in_process
from tests.paths import ROOT
from tests.webhook import Receiver, webhook_receiver

pytestmark = pytest.mark.airflow
SCHEDULES = ROOT / "tests/fixtures/schedules"
SCHEDULE = load_schedule(SCHEDULES / "nightly-local.yaml")
SPEC = RunSpec.from_conf({**default_conf(), **SCHEDULE.run_conf})
BUDGET = SCHEDULE.steps_per_run


def _night(day: int) -> datetime:
    return datetime(2026, 12, day, 1, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def nightly(env: dict[str, str]) -> Iterator[Any]:
    """The schedule's DAG as Airflow parses it from dags/ with the test schedules directory (for the whole module:
    ``dag.test`` parses the folder again to store the DAG)."""
    import nemo_rl_gke.run.paths
    from tests.airflow_compat import dag_bag

    saved = nemo_rl_gke.run.paths.SCHEDULES_DIR
    nemo_rl_gke.run.paths.SCHEDULES_DIR = SCHEDULES
    try:
        bag = dag_bag(str(ROOT / "dags"))
        assert not bag.import_errors, bag.import_errors
        yield bag.dags[SCHEDULE.dag_id]
    finally:
        nemo_rl_gke.run.paths.SCHEDULES_DIR = saved


def _xcom(dag_id: str) -> dict[tuple[str, str], Any]:
    from sandbox.demo import latest_run

    return latest_run(dag_id)["xcom"]


def _creates_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    """Create calls since ``seq``: POSTs that started an operation, other than the lease, a transfer or a resize."""
    skip = (":exportData", ":importData", "/setCommonInstanceMetadata", ":setSize", "/connections/-")
    return [
        c["path"]
        for c in sandbox.calls(since=seq)
        if c["method"] == "POST" and c["operations"] and not c["path"].endswith(skip)
    ]


def _last_seq(sandbox: SandboxProcess) -> int:
    calls = sandbox.calls()
    return calls[-1]["seq"] if calls else 0


def _checkpoint_events(dag_id: str, asset: str | None = None) -> list[dict[str, Any]]:
    """The extras of the events on the DAG's checkpoint Asset (or ``asset``), oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == (asset or t.checkpoint_asset(dag_id)))
            .order_by(AssetEvent.id)
            .all()
        )
        return [dict(e.extra) for e in events]


def _delete_lustre(sandbox: SandboxProcess) -> None:
    """Lustre goes away between nights (someone deleted it, or the sweeper did)."""
    request = urllib.request.Request(
        f"{sandbox.url}/v1/{SPEC.lustre_path}", method="DELETE", headers=sandbox.auth_headers()
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert SPEC.lustre_name not in {r["name"] for r in sandbox.inventory()}


@pytest.fixture
def webhook(env: dict[str, str]) -> Iterator[Receiver]:
    """The deployment's alert connection: a receiver on 127.0.0.1."""
    with webhook_receiver() as receiver, pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_ALERT_WEBHOOK", receiver.connection())
        patch.setenv("AIRFLOW__NEMO_RL_GKE__ALERT_CONN_IDS", "alert_webhook")
        yield receiver


def test_three_nights_cold_warm_not_promoted_and_resumed_from_the_promoted_model(
    sandbox: SandboxProcess, nightly: Any, webhook: Receiver
) -> None:
    sandbox.reset()
    dag_id = SCHEDULE.dag_id

    # Night 1, cold: everything is created, steps 1..N trained and exported, the group kept warm.
    night1 = run_in_process(nightly, None, base=None, logical_date=_night(1))
    assert night1.state == "success", night1.tasks
    first = _xcom(dag_id)
    assert first[(t.RESUME, t.RETURN)]["resumed_from"] is None and first[(t.RESUME, t.RETURN)]["max_steps"] == BUDGET
    assert {first[(k.task_id, t.RETURN)]["action"] for k in t.gcp_resources()} == {outcomes.CREATED}
    assert first[(t.SCALE_POOL, t.RETURN)]["action"] == outcomes.SCALED_TO_ZERO
    assert first[(t.DELETE_CLUSTER, t.RETURN)]["action"] == outcomes.KEPT_BY_POLICY
    gpu = first[(t.RUN_REPORT, t.RETURN)]["gpu"]
    assert gpu["nodes_left_up"] == 0 and gpu["next_run_at"] is not None and gpu["node_hours_to_next_run"] == 0
    kept = {r["name"] for r in sandbox.inventory()}
    assert {SPEC.cluster_name, SPEC.lustre_name, SPEC.network} <= kept
    # Its model was converted, evaluated beside the base model (measured now, once) and published: the first one.
    evaluated = first[(t.EVALUATE, t.RETURN)]
    assert evaluated["baseline_result"]["measured_by"] == f"{dag_id}/{night1.run_id}"
    assert first[(t.PUBLISH, t.RETURN)]["outcome"] == "promoted"
    published = _checkpoint_events(dag_id, t.published_asset(dag_id))
    assert [(e["step"], e["score"]) for e in published] == [(BUDGET, evaluated["score"])]
    assert published[0]["hf_uri"] == f"{published[0]['uri']}hf/" and webhook.received == []

    # A night that starts while another run holds the group (the previous night overran) touches nothing.
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.lease import acquire, release

    holder = Owner(Deployment().deployment_id, SPEC.group_id, f"{dag_id}/scheduled__overrunning")
    acquire(GcpHook(), SPEC.project, holder, 600, names=SPEC.group_names)
    seq = _last_seq(sandbox)
    held = run_in_process(nightly, None, base=None, logical_date=_night(2))
    assert held.tasks[t.LEASE] == "skipped" and held.state == "success"
    assert [c for c in sandbox.calls(since=seq) if c["method"] != "GET"] == []
    release(GcpHook(), SPEC.project, holder, warm=True)

    # Night 2, warm: no create call; it resumes at N on the kept Lustre and ends at 2N. Asked for a gain no score
    # can make, its model is not promoted: the run succeeds, its checkpoint is exported, and the alert says why.
    seq = _last_seq(sandbox)
    night2 = run_in_process(nightly, {"publish_margin": 1.0}, base=None, logical_date=_night(3))
    assert night2.state == "success", night2.tasks
    assert night2.tasks[t.PUBLISH] == "skipped" and night2.tasks[t.EXPORT] == "success"
    assert _creates_since(sandbox, seq) == []
    second = _xcom(dag_id)
    assert {second[(k.task_id, t.RETURN)]["action"] for k in t.gcp_resources()} == {outcomes.EXISTS}
    resumed = second[(t.RESUME, t.RETURN)]
    assert (resumed["action"], resumed["resumed_from"], resumed["max_steps"]) == (
        "warm",
        {"step": BUDGET, "source": "lustre"},
        2 * BUDGET,
    )
    assert [s["step"] for s in second[(t.WAIT, "steps")]] == list(range(BUDGET + 1, 2 * BUDGET + 1))
    # The base model's score was remembered: night 1's, not measured again.
    assert second[(t.EVALUATE, t.RETURN)]["baseline_result"]["measured_by"] == f"{dag_id}/{night1.run_id}"
    decision = second[(t.PUBLISH, t.RETURN)]
    assert decision["outcome"] == "not-promoted" and decision["published"] == published[0]["score"]
    assert len(_checkpoint_events(dag_id, t.published_asset(dag_id))) == 1
    [alert] = webhook.wait_for(1)
    said = alert.json["text"]
    assert said.startswith(f"[{dag_id}] run {night2.run_id} finished, but its model was not promoted: "), said
    assert "Model" in second[(t.RUN_REPORT, t.REPORT_TEXT)] and "not-promoted" in second[(t.RUN_REPORT, t.REPORT_TEXT)]

    # Night 3, after Lustre was deleted, resume=promoted: a new Lustre, the last published model's checkpoint (night
    # 1's, not night 2's) imported into it, resumed at N, ends at 2N again; night 2's step is set aside, not built on.
    _delete_lustre(sandbox)
    # (Its own model is not evaluated: this night is about where it starts.)
    conf = {"teardown_policy": t.DELETE_ALL, "resume": "promoted", "eval_benchmark": "off", "publish": "always"}
    night3 = run_in_process(nightly, conf, base=None, logical_date=_night(4))
    assert night3.state == "success", night3.tasks
    third = _xcom(dag_id)
    assert third[(t.LUSTRE, t.RETURN)]["action"] == outcomes.CREATED
    resumed = third[(t.RESUME, t.RETURN)]
    assert resumed["action"] == outcomes.IMPORTED and resumed["resumed_from"]["step"] == BUDGET
    assert resumed["resumed_from"]["source"] == published[0]["uri"] and resumed["set_aside"] == [2 * BUDGET]
    assert [s["step"] for s in third[(t.WAIT, "steps")]] == list(range(BUDGET + 1, 2 * BUDGET + 1))

    # The lineage, night by night, in the Asset events: each names the checkpoint it continued from.
    events = _checkpoint_events(dag_id)
    assert [e["step"] for e in events] == [BUDGET, 2 * BUDGET, 2 * BUDGET]
    assert [e["parent"] for e in events] == [None, events[0]["uri"], events[0]["uri"]]
    report = third[(t.RUN_REPORT, t.REPORT_TEXT)]
    assert "Lineage" in report and events[0]["uri"] in report
    print(json.dumps([{k: e[k] for k in ("step", "uri", "parent")} for e in events], indent=2))
    # The third night's teardown deleted everything.
    assert sandbox.full_inventory()["resources"] == []
