"""What the plan prints is what the actions send: every create and every delete the resources send to the sandbox,
the PATCHes of a connection another run group shares, and the Lustre export and import the checkpoint steps send,
carry exactly the path and body the plan shows for that step (the sandbox's call log records the JSON each call came
with).

Values only the cloud knows are placeholders in the plan, and filled in here as the run fills them in: the project
number (Service Networking's network path) and the peering range's CIDR that Google picked.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.plan.build import build_plan
from nemo_rl_gke.plan.networks import PEERING_CIDR_PLACEHOLDER
from nemo_rl_gke.plan.peering import OTHER_RANGES_PLACEHOLDER, PROJECT_NUMBER_PLACEHOLDER
from nemo_rl_gke.plan.transfers import import_source, lustre_import_request
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.conf_schema import GROUP_NAME_PARAMS
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.steps import final_step
from sandbox import files
from tests.gcp.conftest import dump, ensure_done, last_seq, wait_for

DAG, RUN = "nemo_rl_grpo_gke", "manual__plan-is-sent"


def _sent(sandbox: SandboxProcess, since: int, method: str = "POST") -> list[dict[str, Any]]:
    """The bodies of the writes the sandbox answered after ``since`` (operation polls are GETs)."""
    return [c for c in sandbox.calls(since) if c["method"] == method]


def _filled(body: Any, number: str, cidr: str) -> Any:
    text = json.dumps(body).replace(PROJECT_NUMBER_PLACEHOLDER, number).replace(PEERING_CIDR_PLACEHOLDER, cidr)
    return json.loads(text)


def _container_messages(message: Any, path: str, sent: Any, printed: Any) -> tuple[Any, Any]:
    """The GKE creates as messages: the plan prints gcloud's JSON (enums by name, ``parent`` repeated in the body,
    some zero values explicit), while the google-cloud-container client sends proto JSON (enums by number, the path's
    ``parent`` not repeated, zeros left out). Decoded, both must be the same request."""
    cls = type(message)
    decoded = cls.from_json(json.dumps(sent))
    decoded.parent = path.removeprefix("/v1/").rsplit("/", 1)[0]  # the client sends it in the path only
    return decoded, cls.from_json(json.dumps(printed))


def test_every_create_and_the_lustre_transfers_send_the_plans_bodies(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    sandbox.seed_reservation(spec.project, spec.zone, spec.reservation, spec.effective_machine_type, 4)
    sandbox.seed_bucket(spec.project)
    plan = build_plan(spec, dag_id=DAG, run_id=RUN)
    # The plan as it prints it (--format json): each step's create, by the object it names.
    printed = plan.to_dict()
    planned = {r["resource"]: r for r in printed["gcp_requests"] if r["http_method"] == "POST"}
    found = resources(spec, plan.owner)
    number = hook.project_number(spec.project)

    compared = 0
    for key, resource in found.items():
        since = last_seq(sandbox)
        ensure_done(resource, hook)
        [create] = [c for c in _sent(sandbox, since) if c["operations"]]
        cidr = ""
        if key == t.LUSTRE_FW:
            address = found[t.PEERING_RANGE].get(hook) or {}
            cidr = f"{address['address']}/{address['prefixLength']}"
        request = planned[resource.request.resource]
        expected = _filled(request["body"], number, cidr)
        # The query carries ids the run picks (requestId) besides the plan's (instanceId).
        assert create["path"] == _filled(request["path"].split("?")[0], number, cidr), key
        sent = create["body"]
        if resource.request.service == "container":
            sent, expected = _container_messages(resource.request.message, create["path"], sent, expected)
        assert sent == expected, f"{key}: sent\n{dump(create['body'])}\nplanned\n{dump(expected)}"
        compared += 1
    assert compared == len(found)

    # The export of the run's final step: the checkpoint is on Lustre, the body is the plan's section 6.
    step = final_step(spec, load_recipe(spec.recipe))
    step_dir = files.lustre_dir(sandbox.state_dir, spec.project, spec.zone, spec.lustre_name)
    step_dir = step_dir / spec.checkpoint_lustre_path(step).lstrip("/")
    step_dir.mkdir(parents=True)
    (step_dir / "training_info.json").write_text(json.dumps({"current_step": step}))
    lustre = found[t.LUSTRE]
    since = last_seq(sandbox)
    assert not wait_for(hook, lustre.export_data(hook, plan.checkpoint.export)).failed
    [export] = _sent(sandbox, since)
    assert export["path"] == printed["checkpoint"]["export"]["path"]
    assert export["body"] == printed["checkpoint"]["export"]["body"]
    assert export["body"]["requestId"].count("-") == 4  # a real uuid5, stable per run and step

    # The resume of a later run on a new Lustre imports that export's run prefix into "/" (the plan's builder).
    uri = spec.export_uri(DAG, RUN, step)
    request = lustre_import_request(spec, DAG, "scheduled__next", import_source(spec, uri, step), step)
    since = last_seq(sandbox)
    ref = lustre.import_data(hook, request, what="import", label="import")
    assert not wait_for(hook, ref).failed
    [sent] = _sent(sandbox, since)
    assert sent["path"] == request.path and sent["body"] == request.body
    assert sent["body"]["gcsPath"]["uri"] == spec.export_prefix(DAG, RUN)

    # Teardown, in the topology's order: each delete sends the method, path and body the plan's teardown prints.
    teardown = printed["teardown"]["steps"]
    deleted = 0
    for step in t.teardown_steps():
        for key in (k for k in step.deletes if k in found):
            since = last_seq(sandbox)
            operation = found[key].delete(hook)
            if operation is not None:
                assert not wait_for(hook, operation).failed, key
            [sent] = [c for c in sandbox.calls(since) if c["method"] in ("DELETE", "POST", "PATCH")]
            [planned_step] = [
                s for s in teardown
                if s["task_id"] == step.task_id and "instead" not in s["note"]
                and s["target"].split(" (")[0].split("?")[0] == sent["path"]
            ]  # fmt: skip
            assert sent["method"] == planned_step["action"], (key, sent["method"], planned_step)
            assert (sent["body"] or None) == _filled(planned_step["body"], number, ""), key
            deleted += 1
    assert deleted == len([k for step in t.teardown_steps() for k in step.deletes if k in found])


def test_a_shared_connection_gets_the_plans_patches_to_add_and_take_out_only_this_groups_range(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # Another run group's connection is on the VPC already: this group's create is the plan's join PATCH with that
    # group's range in place of the placeholder, and its delete the plan's leave PATCH.
    other = dataclasses.replace(spec, lustre_name="nemo-rl-lustre-b", cluster_name="nemo-rl-cluster-b")
    assert other.peering_range != spec.peering_range and other.network == spec.network
    theirs = resources(other, build_plan(other, dag_id=DAG, run_id="manual__b").owner)
    ours = resources(spec, build_plan(spec, dag_id=DAG, run_id=RUN).owner)
    for resource in (theirs[t.NET], theirs[t.PEERING_RANGE], theirs[t.PEERING], ours[t.PEERING_RANGE]):
        ensure_done(resource, hook, adopt_existing=True)
    printed = build_plan(spec, dag_id=DAG, run_id=RUN).to_dict()
    [join] = [r for r in printed["gcp_requests"] if r.get("when")]
    [leave] = [s for s in printed["teardown"]["steps"] if "instead" in s.get("note", "")]
    number = hook.project_number(spec.project)

    since = last_seq(sandbox)
    ensure_done(ours[t.PEERING], hook)
    [patch] = _sent(sandbox, since, "PATCH")
    assert patch["path"] == join["path"].split("?")[0]
    assert patch["body"] == _filled(_others(join["body"], [other.peering_range]), number, "")

    since = last_seq(sandbox)
    operation = ours[t.PEERING].delete(hook)
    assert operation is not None and not wait_for(hook, operation).failed
    [patch] = _sent(sandbox, since, "PATCH")
    assert (patch["method"], patch["path"]) == (leave["action"], leave["target"].split(" (")[0].split("?")[0])
    assert patch["body"] == _filled(_others(leave["body"], [other.peering_range]), number, "")
    # Only this group's range left the connection.
    assert ours[t.PEERING].connection(hook)["reservedPeeringRanges"] == [other.peering_range]


def _others(body: dict[str, Any], ranges: list[str]) -> dict[str, Any]:
    """A join or leave body with the connection's other ranges in place of their placeholder."""
    listed: list[str] = []
    for item in body["reservedPeeringRanges"]:
        listed += ranges if item == OTHER_RANGES_PLACEHOLDER else [item]
    return {**body, "reservedPeeringRanges": listed}


def test_each_delete_sends_the_plans_request_and_builds_none_of_its_own(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # Given another group's delete requests, each resource deletes what those name: the delete reads the plan's
    # request instead of building its own from the resource's names (nothing exists, so each answer is a 404).
    names = {p: f"{getattr(spec, p)}-b" for p in GROUP_NAME_PARAMS if p not in ("project", "region", "zone")}
    other = dataclasses.replace(spec, **names)
    owner = build_plan(spec, dag_id=DAG, run_id=RUN).owner
    ours, theirs = resources(spec, owner), resources(other, owner)
    sent_to = 0
    for key, resource in ours.items():
        if resource.delete_request.message is None:  # the peering: a POST whose body the shared test covers
            continue
        own = resource.delete_request.path
        resource.delete_request = theirs[key].delete_request
        since = last_seq(sandbox)
        assert resource.delete(hook) is None, key
        [sent] = [c for c in sandbox.calls(since) if c["method"] == "DELETE"]
        assert sent["path"] == theirs[key].delete_request.path != own, key
        sent_to += 1
    assert sent_to >= len(ours) - 1
