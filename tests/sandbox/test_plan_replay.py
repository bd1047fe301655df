"""The plan's requests exactly as it prints them (gcloud-shaped JSON, int64 as strings) provision everything on the
sandbox, and its teardown, in the order FACTS §4 gives, deletes all of it."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.plan import networks, peering
from nemo_rl_gke.plan.api import ApiRequest
from nemo_rl_gke.plan.build import build_plan
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.ownership import PLANNED_RUN, run_label
from tests.sandbox.conftest import OWNER, SPEC
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

    def with_number(request: ApiRequest) -> tuple[str, str, Any]:
        # What the run fills in at run time: the project number, the creating run's digest in labels, and the peering
        # range's CIDR as Google picked it (the range exists by then: it comes first in the plan).
        text = json.dumps(request.body).replace(peering.PROJECT_NUMBER_PLACEHOLDER, number)
        if networks.PEERING_CIDR_PLACEHOLDER in text:
            _, address = raw(sandbox.url, "GET", "/compute/v1/" + SPEC.global_address_path(SPEC.peering_range))
            cidr = f"{address['address']}/{address['prefixLength']}"
            text = text.replace(networks.PEERING_CIDR_PLACEHOLDER, cidr)
        text = text.replace(run_label(PLANNED_RUN), run_label("nemo_rl_grpo_gke/manual__replay"))
        path = request.path.replace(peering.PROJECT_NUMBER_PLACEHOLDER, number)
        return request.http_method, path.replace(quote(peering.PROJECT_NUMBER_PLACEHOLDER), number), json.loads(text)

    # The requests every run sends (not the ones sent instead, when another run group shares the connection).
    creates = [planned.request for planned in build_plan(SPEC).requests if not planned.when]
    for request in creates:
        status, answer = raw(sandbox.url, *with_number(request))
        assert status == 200, (request.resource, answer)
        assert "error" not in answer, (request.resource, answer)
    kinds = [i["kind"] for i in sandbox.inventory()]
    assert kinds.count("compute.subnetwork") == 9 and kinds.count("container.nodePool") == 2
    assert {"lustre.instance", "servicenetworking.connection", "compute.address"} <= set(kinds)

    found = resources(SPEC, OWNER)
    deletes = [
        found[target].delete_request for step in t.teardown_steps() for target in step.deletes if target in found
    ]
    for request in deletes:
        status, answer = raw(sandbox.url, *with_number(request))
        assert status == 200, (request.resource, answer)
        assert "error" not in answer, (request.resource, answer)
    assert sandbox.inventory() == []
    # 404 is what a repeated teardown sees.
    for request in deletes:
        assert raw(sandbox.url, *with_number(request))[0] == 404, request.resource
