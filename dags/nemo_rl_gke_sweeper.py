"""The sweeper: every hour, deletes what no NeMo RL GKE run will tear down any more (paused until enabled).

Wiring only: the sweep is nemo_rl_gke.sweeper, run by nemo_rl_gke.operators.sweeper.SweepOperator; nothing heavy is
imported while Airflow parses this file.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from nemo_rl_gke.docs import SWEEPER_DESCRIPTION, SWEEPER_DOC_MD
from nemo_rl_gke.operators.sweeper import SweepOperator
from nemo_rl_gke.spec import RunSpec
from nemo_rl_gke.sweeper import SWEEPER_DAG_ID

with DAG(
    SWEEPER_DAG_ID,
    description=SWEEPER_DESCRIPTION,
    doc_md=SWEEPER_DOC_MD,
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    is_paused_upon_creation=True,
    max_active_runs=1,
    default_args={"owner": "ml-platform", "retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["nemo-rl", "gke", "sweeper"],
    params={
        "project": Param(
            RunSpec().project,
            type="string",
            title="Project",
            description="The Google Cloud project whose run-group leases are swept.",
            minLength=6,
            maxLength=30,
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Report what would be deleted and kept; write nothing (not even a lease).",
        ),
        "warm_ttl_hours": Param(
            24,
            type="number",
            title="Warm TTL (hours)",
            description="A warm group (its last run kept the cluster and storage) idle longer than this is deleted. "
            "A scheduled group idles for its schedule file's own warm_ttl_hours instead.",
            exclusiveMinimum=0,
            maximum=8760,
        ),
    },
) as dag:
    SweepOperator(task_id="sweep")
