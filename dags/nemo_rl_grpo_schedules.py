"""Scheduled NeMo RL GRPO fine-tunes: one DAG per file in include/schedules (nemo_rl_grpo_gke__<name>).

Wiring only: each DAG is built by the same factory as the manual one; a bad schedule file is this file's import
error in Airflow, naming the file, the field and the fix. (Airflow's safe mode parses only files that mention
both "airflow" and "dag".)
"""

from __future__ import annotations

from nemo_rl_gke.dag_factory import build_scheduled_dags

globals().update(build_scheduled_dags())
