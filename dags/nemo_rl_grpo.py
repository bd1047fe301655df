"""NeMo RL GRPO fine-tunes on GKE.

Wiring only: the tasks' logic lives in plugins/nemo_rl_gke, and nothing heavy is imported while this file is parsed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from nemo_rl_gke.dag_params import build_params
from nemo_rl_gke.docs import DAG_DOC_MD
from nemo_rl_gke.operators.preflight import VALIDATE_TASK_ID, PlanOperator, ValidateConfOperator

with DAG(
    dag_id="nemo_rl_grpo_gke",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Every run uses the same resource names, so two at once would fight over them.
    max_active_runs=1,
    params=build_params(),
    tags=["nemo-rl", "grpo", "gke", "gpu"],
    doc_md=DAG_DOC_MD,
    default_args={"owner": "ml-platform", "retries": 2, "retry_delay": timedelta(seconds=30)},
) as dag:
    # A bad conf fails the same way every time: no retries.
    validate = ValidateConfOperator(task_id=VALIDATE_TASK_ID, retries=0)
    plan = PlanOperator(task_id="plan")
    validate >> plan
