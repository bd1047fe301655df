"""The Airflow plugin: the training view, as a tab on every DAG run and task instance of this package's DAGs.

Every Airflow component loads this file (the plugin manager imports it by path, see plugins/.airflowignore), so it
imports nothing but Airflow's plugin base: the view's FastAPI app (fastapi, the view's modules) is built only when
the API server asks for ``fastapi_apps``.

The tabs are ``external_views`` with a ``url_route`` (FACTS §9): the UI shows them in an iframe and fills in
``{DAG_ID}``, ``{RUN_ID}`` and ``{TASK_ID}``. The hrefs are relative, so they resolve against ``[api] base_url`` the
same way under ``airflow standalone``, separately started components and docker-compose. The extra links need no
registration here: the API server reads them from XCom (FACTS §10, :mod:`nemo_rl_gke.links`).
"""

from __future__ import annotations

import functools
from typing import Any

from airflow.plugins_manager import AirflowPlugin

PLUGIN_NAME = "nemo_rl_gke"
URL_PREFIX = "/nemo-rl"
VIEW_NAME = "Training"
# Relative to [api] base_url (no leading slash), so a base_url with a path prefix keeps it.
RUN_HREF = "nemo-rl/training?dag_id={DAG_ID}&run_id={RUN_ID}"
TASK_HREF = RUN_HREF + "&task_id={TASK_ID}"
# A url_route must be unique among all plugins' views; one per destination.
RUN_ROUTE = "nemo-rl-training"
TASK_ROUTE = "nemo-rl-training-task"


@functools.cache
def _app() -> Any:
    # lazy: the FastAPI app is built only in the API server
    from nemo_rl_gke.view_app import create_app

    return create_app()


class _LazyApps:
    """``fastapi_apps`` built on first access: only the API server reads it."""

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        return [{"app": _app(), "url_prefix": URL_PREFIX, "name": "NeMo RL training view"}]


class NemoRlGkePlugin(AirflowPlugin):
    """The training view (a FastAPI app and its two tabs)."""

    name = PLUGIN_NAME
    fastapi_apps = _LazyApps()  # type: ignore[assignment]
    external_views = [  # noqa: RUF012 (Airflow's plugin interface is class attributes)
        {
            "name": VIEW_NAME,
            "href": RUN_HREF,
            "destination": "dag_run",
            "url_route": RUN_ROUTE,
        },
        {
            "name": VIEW_NAME,
            "href": TASK_HREF,
            "destination": "task_instance",
            "url_route": TASK_ROUTE,
        },
    ]
