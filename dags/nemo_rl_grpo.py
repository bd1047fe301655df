"""NeMo RL GRPO fine-tunes on GKE: the manual DAG, triggered from the form or the API.

Wiring only: the DAG is built from the run's topology by nemo_rl_gke.dag_factory, and nothing heavy is imported
while Airflow parses this file.
"""

from __future__ import annotations

from nemo_rl_gke.dag_factory import build_dag
from nemo_rl_gke.docs import DAG_DESCRIPTION, DAG_DOC_MD

dag = build_dag("nemo_rl_grpo_gke", description=DAG_DESCRIPTION, doc_md=DAG_DOC_MD)
