"""Parse a DAG folder with every Connection, Variable and network lookup turned into an error.

Airflow re-parses DAG files every 30 s on every scheduler: a lookup there hammers the metadata DB or a secrets
backend, and a network call can hang the parser. The guard makes such a lookup an import error the tests see.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock


class ParseTimeLookupError(RuntimeError):
    """A DAG file made a lookup or a network call while being parsed."""


def _forbid(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ParseTimeLookupError(f"{what} called at DAG parse time with {args!r}")

    return refuse


FORBIDDEN = {
    "airflow.sdk.execution_time.context._get_connection": "Connection lookup",
    "airflow.sdk.execution_time.context._async_get_connection": "Connection lookup",
    "airflow.sdk.execution_time.context._get_variable": "Variable lookup",
    "airflow.sdk.execution_time.context._get_variable_keys": "Variable lookup",
    "airflow.models.connection.Connection.get_connection_from_secrets": "Connection lookup",
    "airflow.models.variable.Variable.get": "Variable lookup",
    "airflow.models.variable.Variable.get_variable_from_secrets": "Variable lookup",
    "socket.socket.connect": "network connection",
    "socket.socket.connect_ex": "network connection",
    "socket.create_connection": "network connection",
    "socket.getaddrinfo": "DNS lookup",
}


def present(target: str) -> bool:
    """Whether the installed Airflow has ``target``: Airflow 3.1 has no ``_get_variable_keys`` or
    ``_async_get_connection`` (a lookup it does not have cannot be made)."""
    module, _, attr = target.rpartition(".")
    try:
        owner: Any = importlib.import_module(module)
    except ImportError:
        owner_module, _, cls = module.rpartition(".")
        owner = getattr(importlib.import_module(owner_module), cls, None)
    return hasattr(owner, attr)


@contextmanager
def no_parse_time_lookups() -> Iterator[None]:
    """Inside this block any Connection/Variable lookup or socket connection raises ParseTimeLookupError."""
    with ExitStack() as stack:
        for target, what in FORBIDDEN.items():
            if present(target):
                stack.enter_context(mock.patch(target, side_effect=_forbid(what), autospec=False))
        yield


def parse_dag_folder(folder: Path) -> Any:
    """A DagBag of ``folder`` parsed under :func:`no_parse_time_lookups`."""
    from tests.airflow_compat import dag_bag

    with no_parse_time_lookups():
        return dag_bag(str(folder))
