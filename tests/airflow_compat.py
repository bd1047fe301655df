"""What the tests use of Airflow that moved between the versions the package supports (3.1.0 to 3.3).

The package's own moved names are in ``nemo_rl_gke.airflow_compat``; these are the tests' (the DagBag, a DAG's and a
deadline's stored forms), each chosen by what the installed Airflow has.
"""

from __future__ import annotations

from typing import Any


def dag_bag(folder: str, **kwargs: Any) -> Any:
    """A ``DagBag`` of ``folder``: in ``airflow.dag_processing.dagbag`` from 3.2, ``airflow.models.dagbag`` before."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:
        from airflow.models.dagbag import DagBag
    return DagBag(dag_folder=folder, **kwargs)


def stored_deadline(deadline: Any) -> Any:
    """A DAG's ``DeadlineAlert`` as the scheduler stores and reads it back (through JSON): 3.2+ has the encoders,
    3.1 the alert's own (de)serializers."""
    import json

    try:
        from airflow.serialization.decoders import decode_deadline_alert
        from airflow.serialization.encoders import encode_deadline_alert
    except ImportError:
        return type(deadline).deserialize_deadline_alert(json.loads(json.dumps(deadline.serialize_deadline_alert())))
    return decode_deadline_alert(json.loads(json.dumps(encode_deadline_alert(deadline))))


def serialized_dag(dag: Any) -> dict[str, Any]:
    """The DAG as the DAG processor stores it: ``DagSerialization`` from 3.2, ``SerializedDAG`` before."""
    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization
    return DagSerialization.to_dict(dag)
