"""The Airflow names that moved between the versions the package supports (3.1.0 to 3.3), imported from here only.

Each fallback is chosen by what the installed Airflow has, never by its version number, and each says where the
name lives on the older line (``tests/unit/test_airflow_compat.py`` holds every other module to importing them from
here). The floor is tested in CI on its own venv (README "Supported Airflow versions").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup

try:  # 3.2+: the task SDK's own exceptions (airflow.exceptions keeps deprecated aliases of them)
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
except ImportError:  # 3.1: airflow-core's, the ones its task runner catches
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
    )

if TYPE_CHECKING:  # for annotations only (airflow.sdk.types and DeadlineAlert's export are 3.2+)
    from airflow.sdk import Connection, DeadlineAlert
    from airflow.sdk.types import TaskInstanceKey

# TaskInstanceKey is for annotations only (links.py imports it under TYPE_CHECKING).
__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowSkipException",
    "TaskInstanceKey",
    "deadline_alert",
    "get_async_connection",
    "get_async_extra_dejson",
    "redact",
    "task_group",
]

# TaskGroup took doc_md in 3.3 (3.1 and 3.2 refuse the keyword); the group's tooltip is shown on every version.
_GROUP_DOC_MD = "doc_md" in inspect.signature(TaskGroup.__init__).parameters


def task_group(group_id: str, *, tooltip: str, doc_md: str) -> TaskGroup:
    """A task group with its tooltip, and its docs where this Airflow shows a group's docs (3.3+)."""
    if _GROUP_DOC_MD:
        return TaskGroup(group_id, tooltip=tooltip, doc_md=doc_md)
    return TaskGroup(group_id, tooltip=tooltip)


def deadline_alert(callback: Callable[..., Any], *, after: timedelta, kwargs: Mapping[str, Any]) -> DeadlineAlert:
    """A DAG ``DeadlineAlert``: ``callback`` awaited in the triggerer ``after`` the run was queued.

    Imported on call: only a DAG with a deadline builds one. ``airflow.sdk`` exports the classes from 3.2; on 3.1 they
    live in ``airflow.sdk.definitions.deadline``, with the same signatures.
    """
    try:
        from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference
    except ImportError:
        from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineAlert, DeadlineReference

    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=after,
        callback=AsyncCallback(callback, kwargs=dict(kwargs)),
    )


def redact(text: str) -> str:
    """``text`` with every secret this process masked replaced by ``***``: ``airflow.sdk.log`` exports the masker's
    ``redact`` from 3.2; on 3.1 it is the shared masker that ``airflow.sdk.log.mask_secret`` fills."""
    try:
        from airflow.sdk.log import redact as masked
    except ImportError:
        from airflow.sdk._shared.secrets_masker import redact as masked
    return str(masked(text))


try:  # common-compat 1.8+: each picks the safe async path for the running Airflow
    from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson
except ImportError:  # older common-compat (Composer 3's 3.1.0 builds ship 1.7.4): the sync calls in a worker thread
    from airflow.sdk import BaseHook

    async def get_async_connection(conn_id: str, hook: BaseHook | type[BaseHook] | None = None) -> Connection:
        """The connection ``conn_id``, read in a worker thread: before Airflow 3.3.2 the async read masks its secrets
        with a blocking call to the supervisor, unsafe on the triggerer's loop."""
        from asgiref.sync import sync_to_async

        return await sync_to_async((hook or BaseHook).get_connection)(conn_id=conn_id)

    async def get_async_extra_dejson(conn: Connection) -> dict[str, Any]:
        """The connection's extras as a dict, read in a worker thread for the same reason."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: conn.extra_dejson)()
