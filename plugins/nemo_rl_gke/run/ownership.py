"""Who owns a resource: the deployment (one Airflow installation of this package), the run group (the resources one
conf's names describe) and the run that created it.

Every GCP resource and Kubernetes object the package creates carries its :class:`Owner`: as labels where the API has
them, and as an exact, parseable description record where it has none (Compute networks, subnets, firewalls and
addresses, FACTS §15). A resource is this run's to reuse and delete only when both its deployment and its group are
this run's; anything else is foreign: adopted only when the conf says so, and never deleted.

Pure and stdlib-only: the request builders, the manifests and the plan use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

MANAGED_BY_KEY = "managed-by"
MANAGED_BY = "airflow-nemo-rl-gke"
DEPLOYMENT_KEY = "nemo-rl-deployment"
GROUP_KEY = "nemo-rl-group"
RUN_KEY = "nemo-rl-run"
# A description record is exactly this prefix and a JSON object with exactly RECORD_FIELDS: never a substring match.
DESCRIPTION_PREFIX = "nemo-rl-gke owner v1 "
RECORD_FIELDS = ("deployment", "group", "run")
# The plan has no run yet: it shows this placeholder where the creating run goes.
PLANNED_RUN = "<dag_id>/<run_id>"
# The sweeper's DAG: its runs take a swept group's lease as their own (``dag_id/run_id``, like any run).
SWEEPER_DAG_ID = "nemo_rl_gke_sweeper"
# A run group's lease is the project metadata item of this key (nemo_rl_gke.gcp.lease).
LEASE_KEY_PREFIX = "nemo-rl-lease-"


HELD, FREE = "held", "free"


def lease_key(group: str) -> str:
    """The project metadata key of a run group's lease."""
    return LEASE_KEY_PREFIX + group


def reader() -> Owner:
    """The identity of code that only reads resources (their state, an IP): it owns nothing, so it can never pass
    an ownership check, and it must never create anything."""
    return Owner("", "", "")


def run_label(run: str) -> str:
    """The creating run as a label value (labels allow 63 lowercase characters): a stable digest of its id."""
    if run == PLANNED_RUN:
        return "<digest of dag_id/run_id>"
    return "r" + hashlib.sha256(run.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Owner:
    """The identity a run stamps on everything it creates, and checks on everything it finds.

    :param deployment: the deployment's id (Airflow config ``[nemo_rl_gke] deployment_id``).
    :param group: the run group's id (:attr:`nemo_rl_gke.run.spec.RunSpec.group_id`).
    :param run: ``dag_id/run_id`` of the run (``PLANNED_RUN`` in a plan).
    """

    deployment: str
    group: str
    run: str

    @property
    def labels(self) -> dict[str, str]:
        """The labels of a resource this run creates."""
        return {
            MANAGED_BY_KEY: MANAGED_BY,
            DEPLOYMENT_KEY: self.deployment,
            GROUP_KEY: self.group,
            RUN_KEY: run_label(self.run),
        }

    @property
    def group_labels(self) -> dict[str, str]:
        """The labels of what belongs to the group rather than to the run that made it: pod templates, whose change
        would restart the Ray pods on every run that re-applies its RayCluster."""
        return {k: v for k, v in self.labels.items() if k != RUN_KEY}

    @property
    def description(self) -> str:
        """The description record of a resource without labels (Compute networks, subnets, firewalls, addresses)."""
        return DESCRIPTION_PREFIX + json.dumps(
            {"deployment": self.deployment, "group": self.group, "run": self.run}, separators=(",", ":")
        )

    def owns(self, found: Owner | None) -> bool:
        """Whether a resource whose recorded owner is ``found`` belongs to this deployment and group."""
        return found is not None and (found.deployment, found.group) == (self.deployment, self.group)

    def created(self, found: Owner | None) -> bool:
        """Whether this very run created it (labels carry the run's digest, descriptions the run itself)."""
        return found is not None and found.run in (self.run, run_label(self.run))

    def __str__(self) -> str:
        return f"deployment {self.deployment}, group {self.group}"


def owner_from_labels(labels: Any) -> Owner | None:
    """The owner a resource's (or Kubernetes object's) labels record, or None when they record none completely."""
    if not isinstance(labels, Mapping) or labels.get(MANAGED_BY_KEY) != MANAGED_BY:
        return None
    values = [labels.get(key) for key in (DEPLOYMENT_KEY, GROUP_KEY, RUN_KEY)]
    if not all(isinstance(v, str) and v for v in values):
        return None
    return Owner(*values)


def owner_from_description(description: Any) -> Owner | None:
    """The owner a description record names: the whole description must be one record, nothing more or less."""
    if not isinstance(description, str) or not description.startswith(DESCRIPTION_PREFIX):
        return None
    try:
        record = json.loads(description[len(DESCRIPTION_PREFIX) :])
    except (ValueError, RecursionError):  # anyone who can edit the resource writes its description
        return None
    if not isinstance(record, dict) or sorted(record) != sorted(RECORD_FIELDS):
        return None
    if not all(isinstance(record[k], str) and record[k] for k in RECORD_FIELDS):
        return None
    # Re-rendering must give the same text: extra spaces or reordered keys are someone else's imitation.
    found = Owner(record["deployment"], record["group"], record["run"])
    return found if found.description == description else None


@dataclass(frozen=True)
class Lease:
    """One group's lease record, as stored in the metadata item's value (JSON).

    :param state: ``held`` by ``run`` until ``expires_at``, or ``free`` since ``released_at`` (``run`` the last).
    :param warm: the last run kept the group's resources (a warm group the sweeper may delete once idle).
    :param names: the conf values that name the group's resources (``RunSpec.group_names``): what the sweeper
        rebuilds the group's resources from when no run will tear them down.
    :param gpu_nodes: the GPU nodes the holding run may use (``RunSpec.gpu_nodes``), counted against the
        deployment's ``max_gpu_nodes_total`` while the lease is held. A record written before it existed counts 0.
    """

    group: str
    deployment: str
    run: str
    state: str
    acquired_at: float
    expires_at: float
    released_at: float | None = None
    warm: bool = False
    names: dict[str, str] = field(default_factory=dict)
    gpu_nodes: int = 0

    def held_at(self, now: float) -> bool:
        """Whether a run holds it now (held, not expired)."""
        return self.state == HELD and self.expires_at > now

    def holds(self, owner: Owner) -> bool:
        """Whether ``owner``'s run is the holder (expired or not)."""
        return self.state == HELD and (self.deployment, self.run) == (owner.deployment, owner.run)

    def to_value(self) -> str:
        """The metadata value: compact JSON."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_value(cls, value: Any) -> Lease | None:
        """The record in a metadata value, or None when it is not one (someone else's key, a broken write, a field
        of the wrong type: anyone with the project's metadata rights can write one)."""
        try:
            record = json.loads(value)
        except (TypeError, ValueError, RecursionError):
            return None
        required = set(_LEASE_TYPES) - _OPTIONAL_LEASE_FIELDS
        if not isinstance(record, dict) or not required <= set(record) <= set(_LEASE_TYPES):
            return None
        for key, types in _LEASE_TYPES.items():
            if key not in record:
                continue
            if not isinstance(record[key], types) or isinstance(record[key], bool) is not (types is bool):
                return None
        if record["state"] not in (HELD, FREE) or record.get("gpu_nodes", 0) < 0:
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in record["names"].items()):
            return None
        return cls(**record)


def live_gpu_leases(found: Iterable[Lease], deployment: str, group: str, now: float) -> list[Lease]:
    """The leases of ``deployment``'s other groups that a run holds now: whose GPU nodes count against its
    ``max_gpu_nodes_total`` (another deployment's, a free or an expired lease count nothing)."""
    return [
        lease
        for lease in found
        if lease.deployment == deployment and lease.group != group and lease.held_at(now) and lease.gpu_nodes > 0
    ]


def leases_in(items: Mapping[str, Any]) -> list[Lease]:
    """Every lease record among a project's metadata items (key -> value); anything else is skipped."""
    found = [Lease.from_value(v) for k, v in items.items() if k.startswith(LEASE_KEY_PREFIX)]
    return [lease for lease in found if lease is not None]


# Each field of a stored lease and the JSON types it may have.
_LEASE_TYPES: dict[str, Any] = {
    "group": str,
    "deployment": str,
    "run": str,
    "state": str,
    "acquired_at": (int, float),
    "expires_at": (int, float),
    "released_at": (int, float, type(None)),
    "warm": bool,
    "names": dict,
    "gpu_nodes": int,
}
# Fields a record of an older version lacks (their defaults apply).
_OPTIONAL_LEASE_FIELDS = frozenset({"gpu_nodes"})


# Before issue 18 a Lustre instance carried one pending checkpoint in its labels and description: still read (an
# instance marked so is kept), never written.
CHECKPOINT_RUN_KEY = "nemo-rl-ckpt-run"
CHECKPOINT_STEP_KEY = "nemo-rl-ckpt-step"
CHECKPOINT_PREFIX = "nemo-rl-gke pending checkpoint v1 "
# A Lustre instance names, in its description, written once at create, where its checkpoint records live.
RECORDS_PREFIX = "nemo-rl-gke checkpoint records v1 "
# Under the creating run's export bucket: one Storage object per pending checkpoint (nemo_rl_gke.gcp.pending).
RECORDS_PATH = "nemo-rl-gke/records"


def records_uri(spec: RunSpec) -> str:
    """Where a new instance's records go: under the creating run's export bucket."""
    return f"gs://{spec.export_bucket_name}/{RECORDS_PATH}/{spec.project}/{spec.zone}/{spec.lustre_name}/"


def records_description(uri: str) -> str:
    """The description of a new Lustre instance: where its checkpoint records live (``gs://BUCKET/PREFIX/``)."""
    return RECORDS_PREFIX + uri


def records_location(description: Any) -> str | None:
    """The records URI a Lustre instance's description names, or None (an instance made before records)."""
    if not isinstance(description, str) or not description.startswith(RECORDS_PREFIX):
        return None
    uri = description[len(RECORDS_PREFIX) :]
    return uri if uri.startswith("gs://") and uri.endswith("/") and " " not in uri else None


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint on a Lustre instance: whose run, which step, where; pending until an export copies it.

    ``uri`` is set once the export succeeded: the record then stays as a receipt (the listing before a delete counts
    that directory, and the older steps beside it, as saved) and keeps nothing. ``dirs`` are step directories a
    listing found that no record named: recorded under the listing run, so they keep the instance until released.
    Every run and the sweeper keep an instance while a pending record remains, until that checkpoint is exported, or a
    conf names its run to release it (``release_checkpoint_of_run``), or that very run accepts the loss.
    """

    run: str
    step: int
    path: str
    uri: str = ""
    dirs: tuple[str, ...] = ()

    @property
    def pending(self) -> bool:
        """Whether it is the only copy (no export has copied it)."""
        return not self.uri

    @property
    def where(self) -> str:
        """The directories it names, for a message."""
        return ", ".join(self.dirs) if self.dirs else f"{self.path}/step_{self.step}"

    @property
    def labels(self) -> dict[str, str]:
        """The labels of the pre-records mark (read only, for instances marked before records)."""
        return {CHECKPOINT_RUN_KEY: run_label(self.run), CHECKPOINT_STEP_KEY: str(self.step)}

    @property
    def description(self) -> str:
        """The description of the pre-records mark (read only)."""
        record = {"run": self.run, "step": self.step, "path": self.path}
        return CHECKPOINT_PREFIX + json.dumps(record, separators=(",", ":"))

    @property
    def metadata(self) -> dict[str, str]:
        """The record as a Cloud Storage object's custom metadata (strings only)."""
        found = {"run": self.run, "step": str(self.step), "path": self.path}
        if self.uri:
            found["uri"] = self.uri
        if self.dirs:
            found["dirs"] = json.dumps(list(self.dirs), separators=(",", ":"))
        return found

    @classmethod
    def from_metadata(cls, metadata: Any, name: str) -> PendingCheckpoint:
        """The record an object's metadata holds. One that cannot be read still keeps the instance: it counts as a
        pending checkpoint of a run named by its object ``name`` (anyone who can write the bucket can write one)."""
        metadata = metadata if isinstance(metadata, Mapping) else {}
        run, step, path = metadata.get("run"), str(metadata.get("step", "")), metadata.get("path")
        if not (isinstance(run, str) and run and step.isdigit() and isinstance(path, str)):
            return cls(name, 0, "")
        dirs: Any = ()
        if "dirs" in metadata:
            try:
                dirs = json.loads(str(metadata["dirs"]))
            except (ValueError, RecursionError):
                dirs = None
            if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
                return cls(run, int(step), path, dirs=(f"unreadable directory list in {name}",))
        return cls(run, int(step), path, str(metadata.get("uri") or ""), tuple(dirs))

    @classmethod
    def on_instance(cls, labels: Any, description: Any) -> PendingCheckpoint | None:
        """The pre-records mark an instance carries, or None. A mark in the labels with no readable description still
        counts: the checkpoint is kept rather than lost (its run then shows as the label's digest)."""
        labels = labels if isinstance(labels, Mapping) else {}
        digest = labels.get(CHECKPOINT_RUN_KEY)
        record: Any = None
        if isinstance(description, str) and description.startswith(CHECKPOINT_PREFIX):
            try:
                record = json.loads(description[len(CHECKPOINT_PREFIX) :])
            except (ValueError, RecursionError):
                record = None
        if isinstance(record, dict) and isinstance(record.get("run"), str) and isinstance(record.get("step"), int):
            mark = cls(record["run"], record["step"], str(record.get("path", "")))
            if digest in (None, run_label(mark.run)):
                return mark
        if not digest:
            return None
        step = labels.get(CHECKPOINT_STEP_KEY, "")
        return cls(str(digest), int(step) if str(step).isdigit() else 0, "")

    def belongs_to(self, run: str) -> bool:
        """Whether ``run`` (``dag_id/run_id``) made the checkpoint (a mark read from labels alone has the digest)."""
        return self.run in (run, run_label(run))

    def releasable_by(self, run: str, *, accepts_own_loss: bool, release_run: str) -> bool:
        """Whether ``run``'s teardown may delete the instance anyway: that run accepts losing its own checkpoint, or
        the conf names the record's run (a blanket flag never releases another run's checkpoint, nor directories a
        listing found that no record named: those only by name)."""
        named = bool(release_run) and self.belongs_to(release_run)
        return (self.belongs_to(run) and accepts_own_loss and not self.dirs) or named

    def covers(self, directory: str) -> bool:
        """Whether this exported record accounts for a listed step directory (a Lustre path, ``/x/step_N``): its own
        step, or an older step of the same directory (an intermediate save the exported one supersedes)."""
        parent, _, leaf = directory.rstrip("/").rpartition("/")
        if self.pending or not leaf.startswith("step_") or not leaf[5:].isdigit():
            return False
        return parent == self.path.removeprefix("/data").rstrip("/") and int(leaf[5:]) <= self.step
