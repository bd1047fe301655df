"""The plan's requests exactly as it prints them (gcloud-shaped JSON, int64 as strings) provision everything on the
sandbox, and its teardown, in the order FACTS §4 gives, deletes all of it."""

from __future__ import annotations

from nemo_rl_gke.gcp import gke, lustre, networks, peering
from nemo_rl_gke.plan import build_plan
from tests.sandbox.conftest import SPEC
from tests.sandbox.helpers import project_number, raw


def test_every_planned_request_has_a_route(sandbox):
    plan = build_plan(SPEC)
    for planned in plan.requests:
        request = planned.request
        path = request.path.replace(peering.PROJECT_NUMBER_PLACEHOLDER, "1")
        _, answer = raw(sandbox.url, request.http_method, path, {"probe": 1})
        # A route exists: the answer is a check of the body or the world, never "no such URL".
        assert "was not found on this server" not in answer.get("error", {}).get("message", ""), request.path


def test_the_printed_plan_provisions_and_tears_down_everything(clients, sandbox):
    number = project_number(clients)
    creates = [
        *networks.network_requests(SPEC),
        *peering.peering_requests(SPEC, number),
        lustre.lustre_create_request(SPEC),
        *gke.gke_requests(SPEC),
    ]
    for request in creates:
        status, answer = raw(sandbox.url, request.http_method, request.path, request.body)
        assert status == 200, (request.resource, answer)
        assert "error" not in answer, (request.resource, answer)
    kinds = [i["kind"] for i in sandbox.inventory()]
    assert kinds.count("compute.subnetwork") == 9 and kinds.count("container.nodePool") == 2
    assert {"lustre.instance", "servicenetworking.connection", "compute.address"} <= set(kinds)

    deletes = [
        lustre.lustre_delete_request(SPEC),
        *peering.peering_delete_requests(SPEC, number),
        *gke.gke_delete_requests(SPEC),
        *networks.network_delete_requests(SPEC),
    ]
    for request in deletes:
        status, answer = raw(sandbox.url, request.http_method, request.path, request.body)
        assert status == 200, (request.resource, answer)
        assert "error" not in answer, (request.resource, answer)
    assert sandbox.inventory() == []
    # 404 is what a repeated teardown sees.
    for request in deletes:
        assert raw(sandbox.url, request.http_method, request.path, request.body)[0] == 404, request.resource
