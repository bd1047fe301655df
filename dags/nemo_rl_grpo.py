"""NeMo RL GRPO fine-tunes on GKE: the manually triggered DAG and the nightly one.

Wiring only: the tasks' logic lives in plugins/nemo_rl_gke, and nothing heavy is imported while this file is parsed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from nemo_rl_gke.dag_params import build_params, conf_file
from nemo_rl_gke.docs import DAG_DOC_MD
from nemo_rl_gke.operators.preflight import VALIDATE_TASK_ID, PlanOperator, ValidateConfOperator

TAGS = ["nemo-rl", "grpo", "gke", "gpu"]


def build_dag(dag_id: str, schedule: str | None, defaults: dict[str, Any] | None = None) -> DAG:
    """One run of the mission: validate -> plan (the apply tasks come in later releases)."""
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        # Every run of a DAG uses the same resource names, so two at once would fight over them.
        max_active_runs=1,
        is_paused_upon_creation=True,
        params=build_params(defaults),
        tags=TAGS,
        doc_md=DAG_DOC_MD,
        default_args={"owner": "ml-platform", "retries": 2, "retry_delay": timedelta(seconds=30)},
    ) as dag:
        # A bad conf fails the same way every time: no retries.
        validate = ValidateConfOperator(task_id=VALIDATE_TASK_ID, retries=0)
        plan = PlanOperator(task_id="plan")
        validate >> plan
    return dag


nemo_rl_grpo_gke = build_dag("nemo_rl_grpo_gke", schedule=None)
nemo_rl_grpo_gke_nightly = build_dag(
    "nemo_rl_grpo_gke_nightly", schedule="0 2 * * *", defaults=conf_file("nightly.json")
)
