"""Airflow operators: thin glue between the DAG and the package's logic."""
