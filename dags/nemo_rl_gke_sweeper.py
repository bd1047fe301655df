"""The sweeper: every hour, deletes what no NeMo RL GKE run will tear down any more (paused until enabled).

Wiring only: the sweep is nemo_rl_gke.sweeper, run by nemo_rl_gke.operators.sweeper.SweepOperator; nothing heavy is
imported while Airflow parses this file.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from nemo_rl_gke.dag_params import sweeper_params
from nemo_rl_gke.docs import SWEEPER_DESCRIPTION, SWEEPER_DOC_MD
from nemo_rl_gke.operators.sweeper import SweepOperator
from nemo_rl_gke.run.ownership import SWEEPER_DAG_ID

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
    params=sweeper_params(),
) as dag:
    SweepOperator(task_id="sweep")
