"""The capacity ladder's pure parts: the rungs a conf gives, a pool's option as GKE returns it, the served rung."""

from __future__ import annotations

import pytest

from nemo_rl_gke.plan import gke
from nemo_rl_gke.run import capacity
from nemo_rl_gke.run.findings import ConfError
from nemo_rl_gke.run.spec import RunSpec, default_conf
from tests.owners import owner_of


def _spec(**conf: object) -> RunSpec:
    return RunSpec.from_conf({**default_conf(), **conf})


def test_without_a_ladder_the_capacity_is_the_one_rung_and_waits_kube_timeout_s() -> None:
    spec = _spec(capacity="spot", kube_timeout_s=600)
    assert capacity.ladder(spec) == (capacity.Rung("spot", 600.0),)
    assert capacity.longest_wait_s(spec) == 600.0


def test_a_ladders_rungs_take_their_own_seconds_or_kube_timeout_s() -> None:
    spec = _spec(capacity_ladder=["reservation:30", "flex_start", "spot:5"], kube_timeout_s=900, cluster_timeout_s=1200)
    assert capacity.ladder(spec) == (
        capacity.Rung("reservation", 30.0),
        capacity.Rung("flex_start", 900.0),
        capacity.Rung("spot", 5.0),
    )
    assert capacity.options(spec) == ("reservation", "flex_start", "spot")
    assert capacity.rung_index(spec, "spot") == 2 and capacity.rung_index(spec, "on_demand") is None
    # Every rung's wait, and a delete plus a create (each up to cluster_timeout_s) between each two rungs.
    assert capacity.longest_wait_s(spec) == 30 + 900 + 5 + 2 * 1200 * 2


@pytest.mark.parametrize(
    "rung", ["preemptible", "spot:0", "spot:1234567", "spot:", "spot:1.5", "Spot", " spot", "spot:30;rm -rf /"]
)
def test_a_rung_not_in_the_form_is_refused_with_the_form(rung: str) -> None:
    with pytest.raises(ConfError) as caught:
        _spec(capacity_ladder=["reservation", rung])
    message = str(caught.value)
    assert "capacity_ladder" in message and "OPTION or OPTION:SECONDS" in message


@pytest.mark.parametrize("option", ["reservation", "flex_start", "spot", "on_demand"])
def test_each_options_pool_as_gke_returns_it_reads_back_as_that_option(option: str) -> None:
    spec = capacity.on_rung(_spec(capacity_ladder=["reservation", "flex_start", "spot", "on_demand"]), option)
    body = gke.node_pool_create_request(spec, owner_of(spec)).body["nodePool"]
    assert capacity.pool_capacity(body) == option
    assert spec.capacity == option


def test_the_served_capacity_is_the_last_served_row() -> None:
    def row(option: str, outcome: str) -> dict[str, object]:
        return capacity.row(option, 1.0, started_at="", ended_at="", outcome=outcome, message="")

    assert capacity.served_capacity(None) is None
    assert capacity.served_capacity({"capacity": "not rows"}) is None
    assert capacity.served_capacity({"capacity": [row("reservation", capacity.STOCKOUT)]}) is None
    rows = [row("reservation", capacity.NO_NODES), row("spot", capacity.SERVED)]
    assert capacity.served_capacity({"capacity": rows}) == "spot"


def test_the_plan_names_each_rung_with_its_wait_and_its_pools_price() -> None:
    from nemo_rl_gke.plan.build import build_plan

    plan = build_plan(_spec(capacity_ladder=["reservation:600", "flex_start:3600", "spot"], kube_timeout_s=900))
    rungs = plan.bounds["capacity_ladder"]
    assert [(r["capacity"], r["wait_s"]) for r in rungs] == [("reservation", 600), ("flex_start", 3600), ("spot", 900)]
    # The tutorial's pool (2 x 8 B200): list, flex-start's and Spot's default discounts.
    assert [r["usd_per_hour"] for r in rungs] == pytest.approx([176.0, 82.72, 70.4])
    assert (
        "capacity ladder: 1. reservation (nodes within 600 s, 176 USD/h); 2. flex_start (nodes within 3600 s, "
        "82.72 USD/h); 3. spot (nodes within 900 s, 70.4 USD/h)." in plan.to_text()
    )
    # One option is no ladder: the plan says nothing of one.
    assert "capacity ladder" not in build_plan(_spec(capacity="spot")).to_text()


@pytest.mark.parametrize(
    ("option", "said", "fix"),
    [
        (
            "reservation",
            "reservation 'nemo-rl-reservation' in zone us-central1-b has no capacity left",
            "a reservation",
        ),
        ("spot", "zone us-central1-b has no spot capacity for a4-highgpu-8g", "another zone, or a capacity_ladder"),
        ("on_demand", "zone us-central1-b has no on_demand capacity for a4-highgpu-8g", "another zone"),
    ],
)
def test_a_stocked_out_pool_names_what_ran_out_for_its_own_capacity(option: str, said: str, fix: str) -> None:
    from nemo_rl_gke.gcp.resources.registry import resources
    from nemo_rl_gke.run import topology

    spec = _spec(capacity=option)
    pool = resources(spec, owner_of(spec))[topology.NODE_POOL]
    assert pool.problem({"conditions": [{"code": "ERROR", "message": "other"}]}) == ""
    problem = pool.problem({"conditions": [{"code": "GCE_STOCKOUT", "message": "no resources"}]})
    assert "GCE_STOCKOUT: no resources" in problem and said in problem and f"Fix: use {fix}" in problem


def test_a_queued_pool_is_flex_start_with_queued_provisioning_and_its_run_limit_goes_on_the_request() -> None:
    from nemo_rl_gke.plan.build import build_plan

    plan = build_plan(_spec(capacity="queued", flex_start_max_hours=20))
    [pool] = [r.request for r in plan.requests if r.request.path.endswith("/nodePools")]
    body = pool.body["nodePool"]
    assert capacity.pool_capacity(body) == "queued" and body["queuedProvisioning"] == {"enabled": True}
    assert body["config"]["flexStart"] is True and "maxRunDuration" not in body["config"]
    [request] = [m.obj for m in plan.manifests if m.obj["kind"] == "ProvisioningRequest"]
    assert request["spec"]["parameters"] == {"maxRunDurationSeconds": "72000"}
    # A queued rung on a ladder is refused: its workers would wait on a request no other rung's pool serves.
    from nemo_rl_gke.preflight.offline import check_conf

    spec, findings = check_conf({**default_conf(), "capacity": "queued", "capacity_ladder": ["queued:600", "spot"]})
    assert spec is None and [f.rule_id for f in findings] == ["gpu.queued-alone"]
