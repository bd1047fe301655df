"""The checkpoint records of a Lustre instance in Cloud Storage, against the sandbox's objects API, through the
production hook: each run writes and deletes only its own object, every record lists, and the API answers as Cloud
Storage does (404 with Google's body for a missing object, pages of ``maxResults``, 400 for a bad bucket name)."""

from __future__ import annotations

import pytest
from googleapiclient.errors import HttpError
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp import pending
from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.pending import CheckpointRecords, exported_copy_exists
from nemo_rl_gke.run.ownership import PendingCheckpoint, records_description, records_uri
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import last_seq

RUNS = [f"nemo_rl_grpo_gke/manual__2026-12-0{n}" for n in range(1, 4)]


@pytest.fixture(autouse=True)
def export_bucket(sandbox: SandboxProcess, project: str) -> None:
    """The project's export bucket exists, as a user sets it up before a run (the records live there)."""
    sandbox.seed_bucket(project)


def test_each_run_writes_and_removes_only_its_own_record(hook: GcpHook, spec: RunSpec, sandbox) -> None:
    records = CheckpointRecords(hook, spec, None)
    for n, run in enumerate(RUNS):
        records.put(PendingCheckpoint(run, 10 * (n + 1), f"/data/exp_{n}"))
    seq = last_seq(sandbox)
    # A run's record is its own object: replacing it and removing it are one request each, no read first.
    records.put(PendingCheckpoint(RUNS[1], 25, "/data/exp_1"))
    assert records.remove(RUNS[0]) is True
    calls = [(c["method"], c["status"]) for c in sandbox.calls(since=seq) if c["service"] == "storage"]
    assert calls == [("POST", 200), ("DELETE", 204)]
    assert records.remove(RUNS[0]) is False  # already gone: 404 is done
    assert sorted((r.run, r.step, r.path) for r in records.all()) == [
        (RUNS[1], 25, "/data/exp_1"),
        (RUNS[2], 30, "/data/exp_2"),
    ]


def test_an_instance_names_its_records_bucket_so_a_run_with_another_export_bucket_finds_them(
    hook: GcpHook, spec: RunSpec
) -> None:
    import dataclasses

    creator = CheckpointRecords(hook, spec, None)
    creator.put(PendingCheckpoint(RUNS[0], 10, "/data/a"))
    instance = {"description": records_description(records_uri(spec))}
    later = dataclasses.replace(spec, export_bucket="another-teams-bucket")
    assert [r.run for r in CheckpointRecords(hook, later, instance).all()] == [RUNS[0]]
    assert CheckpointRecords(hook, later, None).all() == []


def test_records_list_in_pages_and_the_api_answers_as_cloud_storage(
    hook: GcpHook, spec: RunSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = CheckpointRecords(hook, spec, None)
    for n in range(5):
        records.put(PendingCheckpoint(f"dag/run-{n}", n, "/data/x"))
    page = hook.storage.objects().list(bucket=records.bucket, prefix=records.prefix, maxResults=2)
    first = pending.execute(hook, page, "list")
    assert len(first["items"]) == 2 and first["nextPageToken"]
    assert len(records.names()) == 5  # every page followed
    with pytest.raises(HttpError) as missing:
        pending.execute(hook, hook.storage.objects().delete(bucket=records.bucket, object="no/such"), "delete")
    assert missing.value.resp.status == 404
    with pytest.raises(HttpError) as bad:
        pending.execute(hook, hook.storage.objects().list(bucket="Not_A_Bucket"), "list")
    assert bad.value.resp.status == 400
    assert exported_copy_exists(hook, f"gs://{records.bucket}/{records.prefix}") is True
    assert exported_copy_exists(hook, f"gs://{records.bucket}/nothing-here/") is False


def test_a_record_nobody_can_read_still_keeps_the_instance() -> None:
    broken = PendingCheckpoint.from_metadata({"run": "x"}, "gs://b/records/r1.json")
    assert broken.pending and broken.run == "gs://b/records/r1.json"
    listed = PendingCheckpoint.from_metadata({"run": "d/r", "step": "3", "path": "", "dirs": "not json"}, "n")
    assert listed.pending and listed.dirs == ("unreadable directory list in n",)
