"""The checkpoint records of a Lustre instance: one Cloud Storage object per run, in the bucket the instance names.

Why objects and not the instance's labels or description (FACTS §15): labels hold at most 64 entries of 63 characters
of ``[a-z0-9_-]`` (no path fits), and a label or description change is a read-modify-write of the whole map with no
etag or fingerprint in the Lustre API, a long-running operation besides (issue 17 item 7: the submit waited up to
120 s on it). An object per run has room for the whole record, and each run writes and deletes only its own key
(``<records>/<run digest>.json``), so no run can drop another's: there is nothing to read-modify-write. A write is one
request that is done when it returns (strongly consistent, listed at once), so the submit waits on no operation.

Where: ``gs://<bucket>/nemo-rl-gke/records/<project>/<zone>/<instance>/``. The bucket is the export bucket of the
run that created the instance, written once into the instance's description at create
(:func:`~nemo_rl_gke.run.ownership.records_description`): every later run of the group, whatever its own
``export_bucket``, and the sweeper (which knows only the group's names) find the records there. An instance made
before records has no such description: its records are looked for in the reader's export bucket, and its old
label mark (:meth:`~nemo_rl_gke.run.ownership.PendingCheckpoint.on_instance`) still counts.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from nemo_rl_gke.gcp.hooks import is_not_found
from nemo_rl_gke.run.ownership import PendingCheckpoint, records_location, records_uri, run_label

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)

# A listing's orphan record sits beside the listing run's own: its key is the run's digest and this.
ORPHANS = "-unrecorded"
_URI = re.compile(r"^gs://([^/]+)/(.*)$")


def execute(hook: GcpHook, request: Any, what: str) -> Any:
    """Execute a Cloud Storage request under the hook's retry policy."""
    endpoint = hook.endpoint("storage")
    if endpoint and request.uri.startswith("https://"):
        # googleapiclient builds upload URLs from the rootUrl's scheme, whatever the endpoint override says.
        request.uri = urlunsplit((urlsplit(endpoint).scheme, *urlsplit(request.uri)[1:]))
    return hook.execute(request, what=what)


class CheckpointRecords:
    """The records of one Lustre instance (as read: ``actual`` is its ``instances.get`` body, or None when gone)."""

    def __init__(self, hook: GcpHook, spec: RunSpec, actual: dict[str, Any] | None) -> None:
        self.hook = hook
        named = records_location((actual or {}).get("description"))
        # The instance names where its records went: a bucket missing there means they cannot be read, not none.
        self.named = named is not None
        self.uri = named or records_uri(spec)
        match = _URI.match(self.uri)
        assert match is not None, self.uri
        self.bucket, self.prefix = match.group(1), match.group(2)

    def _name(self, run: str, suffix: str = "") -> str:
        return f"{self.prefix}{run_label(run)}{suffix}.json"

    def _execute(self, request: Any, what: str) -> Any:
        return execute(self.hook, request, what)

    def put(self, record: PendingCheckpoint, suffix: str = "") -> str:
        """Write ``record`` as its run's object (replacing that run's earlier one); returns ``gs://`` of it."""
        from googleapiclient.http import MediaInMemoryUpload

        name = self._name(record.run, suffix)
        body = json.dumps({**record.metadata, "dirs": list(record.dirs)}, indent=1).encode()
        request = self.hook.storage.objects().insert(
            bucket=self.bucket,
            body={"name": name, "contentType": "application/json", "metadata": record.metadata},
            media_body=MediaInMemoryUpload(body, mimetype="application/json"),
        )
        self._execute(request, f"write the checkpoint record gs://{self.bucket}/{name}")
        return f"gs://{self.bucket}/{name}"

    def remove_record(self, record: PendingCheckpoint) -> bool:
        """Delete the object ``record`` was read from (a run's own, or its listing's unrecorded directories)."""
        return self.remove(record.run, ORPHANS if record.dirs else "")

    def remove(self, run: str, suffix: str = "") -> bool:
        """Delete ``run``'s own record; False when it had none."""
        name = self._name(run, suffix)
        try:
            self._execute(
                self.hook.storage.objects().delete(bucket=self.bucket, object=name),
                f"delete the checkpoint record gs://{self.bucket}/{name}",
            )
        except Exception as exc:
            if is_not_found(exc):
                return False
            raise
        return True

    def names(self) -> list[tuple[str, dict[str, Any]]]:
        """Every object under the records prefix: (name, custom metadata)."""
        found: list[tuple[str, dict[str, Any]]] = []
        token = None
        while True:
            request = self.hook.storage.objects().list(bucket=self.bucket, prefix=self.prefix, pageToken=token)
            try:
                page = self._execute(request, f"list the checkpoint records under {self.uri}")
            except Exception as exc:
                if is_not_found(exc) and not self.named:  # an instance made before records, no such bucket: none
                    return found
                if is_not_found(exc):
                    raise RuntimeError(
                        f"the checkpoint records bucket of this Lustre instance ({self.uri}) does not exist, so what "
                        "is pending on it cannot be read: the instance is kept. Recreate the bucket, or delete the "
                        "instance by hand once its checkpoints are safe"
                    ) from exc
                raise
            found += [(item["name"], item.get("metadata") or {}) for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return found

    def all(self) -> list[PendingCheckpoint]:
        """Every record, each read as strictly as :meth:`PendingCheckpoint.from_metadata` does."""
        return [PendingCheckpoint.from_metadata(meta, f"gs://{self.bucket}/{name}") for name, meta in self.names()]

    def remove_all(self) -> int:
        """Delete every record (the instance is being deleted, each one released); returns how many."""
        removed = 0
        for name, _ in self.names():
            try:
                self._execute(
                    self.hook.storage.objects().delete(bucket=self.bucket, object=name),
                    f"delete the checkpoint record gs://{self.bucket}/{name}",
                )
                removed += 1
            except Exception as exc:
                if not is_not_found(exc):
                    raise
        return removed


def exported_copy_exists(hook: GcpHook, uri: str) -> bool:
    """Whether ``gs://bucket/prefix/`` holds at least one object (an exported step directory is there)."""
    match = _URI.match(uri)
    if match is None:
        return False
    request = hook.storage.objects().list(bucket=match.group(1), prefix=match.group(2), maxResults=1)
    try:
        page = execute(hook, request, f"list {uri}")
    except Exception as exc:
        if is_not_found(exc):
            return False
        raise
    return bool(page.get("items"))


def pending_rows(records: Sequence[PendingCheckpoint]) -> list[dict[str, Any]]:
    """The pending checkpoints as the run report and the Training view list them: whose, which, and how to release."""
    return [
        {"run": r.run, "step": r.step, "where": r.where, "release": f"release_checkpoint_of_run={r.run!r}"}
        for r in records
        if r.pending
    ]


def unrecorded(listing: Sequence[str], records: Sequence[PendingCheckpoint]) -> list[str]:
    """The listed step directories (Lustre paths, ``/x/step_N``) no record accounts for: not saved by an export
    (:meth:`PendingCheckpoint.covers`, the exported copy checked separately) and not in a pending record's directory."""
    pending_dirs = {r.path.removeprefix("/data").rstrip("/") for r in records if r.pending and not r.dirs}
    named = {d for r in records if r.dirs for d in r.dirs}
    return [
        d
        for d in listing
        if d not in named
        and d.rstrip("/").rpartition("/")[0] not in pending_dirs
        and not any(r.covers(d) for r in records)
    ]


def records_before_delete(
    hook: GcpHook, spec: RunSpec, actual: dict[str, Any], *, run: str, listing: Sequence[str] | None
) -> list[PendingCheckpoint]:
    """The records that decide whether the instance may go, after comparing ``listing`` (the step directories the
    run's validation job found on the instance, None when it did not list) with them.

    An exported record counts only while its copy is still in the bucket. Listed directories no record accounts for
    are recorded now, under ``run`` (key ``<digest>-unrecorded``), so they keep the instance until a conf names ``run``
    to release them: a directory whose record was lost in a crash is kept like one that was recorded.
    """
    store = CheckpointRecords(hook, spec, actual)
    found = store.all()
    exported = [r for r in found if not r.pending]
    gone = [r for r in exported if not exported_copy_exists(hook, r.uri)]
    records = [r for r in found if r not in gone]
    if listing is not None:
        lost = unrecorded(listing, records)
        if lost:
            orphans = PendingCheckpoint(run, 0, "", dirs=tuple(lost))
            store.put(orphans, ORPHANS)
            records = [r for r in records if not (r.dirs and r.belongs_to(run))] + [orphans]
    legacy = PendingCheckpoint.on_instance(actual.get("labels"), actual.get("description"))
    return [*records, legacy] if legacy is not None else records


def release(
    hook: GcpHook,
    spec: RunSpec,
    actual: dict[str, Any],
    records: Sequence[PendingCheckpoint],
    *,
    run: str,
    accepts_own_loss: bool,
    release_run: str,
) -> list[PendingCheckpoint]:
    """Delete the pending records this teardown releases (its own run's with ``accepts_own_loss``, or the run the
    conf names) and return the records left: a release is final, even when another run's record keeps the instance.
    The pre-records label mark cannot be removed without writing the instance: it stays, and counts, until then."""
    store = CheckpointRecords(hook, spec, actual)
    left = []
    for record in records:
        released = record.pending and record.releasable_by(
            run, accepts_own_loss=accepts_own_loss, release_run=release_run
        )
        if released and record != PendingCheckpoint.on_instance(actual.get("labels"), actual.get("description")):
            store.remove_record(record)
            log.warning("Released the unexported checkpoint of run %s (%s) on Lustre instance %s: record deleted",
                        record.run, record.where, spec.lustre_name)  # fmt: skip
            continue
        left.append(record)
    return left
