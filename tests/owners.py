"""The identity tests give the runs they make without a DAG: the default deployment and a fixed test run."""

from __future__ import annotations

from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.spec import RunSpec

TEST_RUN = "nemo_rl_grpo_gke/manual__test"


def owner_of(spec: RunSpec, run: str = TEST_RUN) -> Owner:
    """The owner a run of ``spec`` in the default deployment stamps on what it creates."""
    return Owner(Deployment().deployment_id, spec.group_id, run)
