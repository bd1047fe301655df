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
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

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
    :param group: the run group's id (:attr:`nemo_rl_gke.spec.RunSpec.group_id`).
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
    except ValueError:
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
    """

    group: str
    deployment: str
    run: str
    state: str
    acquired_at: float
    expires_at: float
    released_at: float | None = None
    warm: bool = False

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
        """The record in a metadata value, or None when it is not one (someone else's key, a broken write)."""
        try:
            record = json.loads(value)
            return cls(**record) if isinstance(record, dict) else None
        except (TypeError, ValueError):
            return None


# A Lustre instance that holds a checkpoint not yet exported says so itself (FACTS §15: labels and description).
CHECKPOINT_RUN_KEY = "nemo-rl-ckpt-run"
CHECKPOINT_STEP_KEY = "nemo-rl-ckpt-step"
CHECKPOINT_PREFIX = "nemo-rl-gke pending checkpoint v1 "


@dataclass(frozen=True)
class PendingCheckpoint:
    """The checkpoint a Lustre instance holds that no export has copied yet: whose run, which step, where.

    Every run and the sweeper keep a marked instance until that checkpoint is exported, or a conf names the run to
    release it (``release_checkpoint_of_run``), or that very run accepts the loss.
    """

    run: str
    step: int
    path: str

    @property
    def labels(self) -> dict[str, str]:
        """The labels that mark the instance (filterable: ``labels.nemo-rl-ckpt-run:*``)."""
        return {CHECKPOINT_RUN_KEY: run_label(self.run), CHECKPOINT_STEP_KEY: str(self.step)}

    @property
    def description(self) -> str:
        """The instance's description while the mark is on: the whole record, readable."""
        record = {"run": self.run, "step": self.step, "path": self.path}
        return CHECKPOINT_PREFIX + json.dumps(record, separators=(",", ":"))

    @classmethod
    def on_instance(cls, labels: Any, description: Any) -> PendingCheckpoint | None:
        """The mark an instance carries, or None. A mark in the labels with no readable description still counts:
        the checkpoint is kept rather than lost (its run then shows as the label's digest)."""
        labels = labels if isinstance(labels, Mapping) else {}
        digest = labels.get(CHECKPOINT_RUN_KEY)
        record: Any = None
        if isinstance(description, str) and description.startswith(CHECKPOINT_PREFIX):
            try:
                record = json.loads(description[len(CHECKPOINT_PREFIX) :])
            except ValueError:
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
        the conf names the marking run (a blanket flag never releases another run's checkpoint)."""
        named = bool(release_run) and self.belongs_to(release_run)
        return (self.belongs_to(run) and accepts_own_loss) or named
