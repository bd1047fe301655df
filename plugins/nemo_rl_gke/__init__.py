"""Airflow DAG package that runs NVIDIA NeMo RL GRPO fine-tunes on GKE from an empty project back to nothing."""
