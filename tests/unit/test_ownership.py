"""Who owns what: the owner records (labels and exact description records), leases and pending-checkpoint marks."""

from __future__ import annotations

import json

import pytest

from nemo_rl_gke.run.ownership import (
    DESCRIPTION_PREFIX,
    FREE,
    HELD,
    MANAGED_BY,
    Lease,
    Owner,
    PendingCheckpoint,
    owner_from_description,
    owner_from_labels,
    run_label,
)

OURS = Owner("prod", "nemo-rl-cluster-1234abcd", "nemo_rl_grpo_gke/manual__2026-12-01T00:00:00+00:00")


def test_labels_and_description_record_round_trip() -> None:
    found = owner_from_labels(OURS.labels)
    assert found is not None and OURS.owns(found) and OURS.created(found)
    assert found.run == run_label(OURS.run)  # labels hold the run's digest (63 lowercase characters at most)
    assert owner_from_description(OURS.description) == OURS
    assert OURS.created(owner_from_description(OURS.description))


def test_another_deployment_or_group_is_not_ours() -> None:
    for other in (Owner("staging", OURS.group, OURS.run), Owner(OURS.deployment, "other-group", OURS.run)):
        assert not OURS.owns(owner_from_labels(other.labels))
        assert not OURS.owns(owner_from_description(other.description))
    assert not OURS.owns(None)
    # The same group and deployment, another run: ours to reuse, not created by this run.
    later = Owner(OURS.deployment, OURS.group, "nemo_rl_grpo_gke/scheduled__2026-12-02")
    assert later.owns(OURS) and not later.created(owner_from_labels(OURS.labels))


@pytest.mark.parametrize(
    "description",
    [
        # Mentions the marker, or wraps a valid record in other text: a human wrote it, not this package.
        f"managed-by {MANAGED_BY}: do not delete",
        f"Our VPC. {OURS.description}",
        f"{OURS.description} (copied from prod)",
        OURS.description.replace('{"deployment"', '{ "deployment"'),
        DESCRIPTION_PREFIX + json.dumps({"group": OURS.group, "deployment": OURS.deployment, "run": OURS.run}),
        DESCRIPTION_PREFIX + json.dumps({"deployment": OURS.deployment, "group": OURS.group}),
        DESCRIPTION_PREFIX + '{"deployment":"prod","group":"g","run":"r","extra":"x"}',
        DESCRIPTION_PREFIX + '{"deployment":"","group":"g","run":"r"}',
        DESCRIPTION_PREFIX + '{"deployment":1,"group":"g","run":"r"}',
        DESCRIPTION_PREFIX + "[" * 10_000,
        None,
        42,
    ],
    ids=lambda value: repr(value)[:40],
)
def test_a_description_that_merely_contains_the_marker_is_not_owned(description: object) -> None:
    assert owner_from_description(description) is None


@pytest.mark.parametrize(
    "labels",
    [
        {**OURS.labels, "managed-by": "someone-else"},
        {k: v for k, v in OURS.labels.items() if k != "nemo-rl-group"},
        {**OURS.labels, "nemo-rl-deployment": ""},
        "managed-by=airflow-nemo-rl-gke",
        None,
    ],
)
def test_labels_count_only_when_complete(labels: object) -> None:
    assert owner_from_labels(labels) is None


def _lease(**changes: object) -> dict[str, object]:
    base = Lease(OURS.group, OURS.deployment, OURS.run, HELD, 100.0, 200.0)
    return {**json.loads(base.to_value()), **changes}


def test_a_lease_round_trips_and_says_who_holds_it_until_when() -> None:
    lease = Lease.from_value(json.dumps(_lease()))
    assert lease is not None and lease.holds(OURS) and lease.held_at(150.0) and not lease.held_at(200.0)
    assert not lease.holds(Owner("staging", OURS.group, OURS.run))
    freed = Lease.from_value(json.dumps(_lease(state=FREE, released_at=180.0, warm=True)))
    assert freed is not None and not freed.held_at(150.0) and not freed.holds(OURS) and freed.warm


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        json.dumps(["a", "list"]),
        json.dumps(_lease(expires_at="tomorrow")),
        json.dumps(_lease(expires_at=True)),
        json.dumps(_lease(warm="yes")),
        json.dumps(_lease(state="borrowed")),
        json.dumps(_lease(extra=1)),
        json.dumps(_lease(names={"network": 1})),
        json.dumps(_lease(names=["network"])),
        json.dumps({k: v for k, v in _lease().items() if k != "run"}),
        None,
    ],
)
def test_a_broken_or_foreign_lease_record_reads_as_none_never_raises(value: object) -> None:
    assert Lease.from_value(value) is None


def test_a_pending_checkpoint_is_released_only_by_naming_its_run_or_by_its_own_run_accepting_the_loss() -> None:
    mark = PendingCheckpoint(OURS.run, 20, "/data/ckpt")
    found = PendingCheckpoint.on_instance(mark.labels, mark.description)
    assert found == mark
    other = "nemo_rl_grpo_gke/scheduled__2026-12-02"
    # Another run keeps it, whatever its accept flag; naming the run releases it.
    assert not found.releasable_by(other, accepts_own_loss=True, release_run="")
    assert not found.releasable_by(other, accepts_own_loss=True, release_run="nemo_rl_grpo_gke/other_run")
    assert found.releasable_by(other, accepts_own_loss=False, release_run=OURS.run)
    # The run that made it may accept its own loss.
    assert found.releasable_by(OURS.run, accepts_own_loss=True, release_run="")
    assert not found.releasable_by(OURS.run, accepts_own_loss=False, release_run="")


@pytest.mark.parametrize("edited", ["someone edited this", "nemo-rl-gke pending checkpoint v1 " + "[" * 10_000])
def test_a_mark_with_an_unreadable_description_still_keeps_the_instance(edited: str) -> None:
    mark = PendingCheckpoint(OURS.run, 20, "/data/ckpt")
    found = PendingCheckpoint.on_instance(mark.labels, edited)
    assert found is not None and found.step == 20 and found.belongs_to(OURS.run)
    # Naming the run still releases it: the labels hold its digest.
    assert found.releasable_by("x/y", accepts_own_loss=False, release_run=OURS.run)
    assert PendingCheckpoint.on_instance({}, "") is None
