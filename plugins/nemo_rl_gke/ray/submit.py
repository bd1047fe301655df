"""What a Ray job submission needs besides the transport: the job's secrets and KubeRay's Ray token.

Secrets are resolved here, at the last moment, from Airflow connections into the runtime env only; they are registered
with Airflow's secrets masker first, so no log line can show them. Only connections the deployment allows for each
secret are ever read. The Ray token is named by where it is (:func:`ray_token_source`: trigger kwargs that are stored
in the metadata DB) and read by the hooks (:mod:`nemo_rl_gke.ray.hooks`, :mod:`nemo_rl_gke.ray.async_hooks`), which
send it as ``X-Ray-Authorization``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.plan.ray_job import JobRequest, allowed_secret_conn_ids
from nemo_rl_gke.run.deployment import ConnectionNotAllowedError, Deployment
from nemo_rl_gke.run.recipes import load_recipe

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# KubeRay 1.5.1+ with ``authOptions: {mode: token}`` keeps the Ray token in a Secret named after the RayCluster
# (``utils.CheckName(name)``), under this key (``utils.RAY_AUTH_TOKEN_SECRET_KEY``; `kubectl ray get token` reads it).
RAY_TOKEN_KEY = "auth_token"
# Through the API server's service proxy ``Authorization`` carries the Google token and is consumed by the API server;
# Ray's middleware reads this header next ("for proxies and KubeRay", ray._private.authentication).
RAY_TOKEN_HEADER = "X-Ray-Authorization"
# The loggers the kubernetes clients write every response body to, at DEBUG.
KUBE_REST_LOGGERS = ("kubernetes.client.rest", "kubernetes_asyncio.client.rest")
_SECRET_BODY = re.compile(rb'"kind":\s*"Secret"')


class SecretMissingError(RuntimeError):
    """A connection the job needs a secret from does not exist or has no password."""


class RayTokenMissingError(RuntimeError):
    """The RayCluster authenticates with a token, but KubeRay's Secret holding it is missing or has no token."""


def kuberay_name(name: str) -> str:
    """KubeRay's ``utils.CheckName``: the last 50 characters, a leading digit or punctuation replaced by ``r``."""
    name = name[-50:]
    return "r" + name[1:] if name and (name[0].isdigit() or not name[0].isalnum()) else name


def ray_token_secret_path(namespace: str, raycluster: str) -> str:
    """The Kubernetes API path of the Secret KubeRay keeps the RayCluster's Ray token in."""
    return f"/api/v1/namespaces/{namespace}/secrets/{kuberay_name(raycluster)}"


def ray_token_of(secret: Mapping[str, Any] | None, path: str) -> str:
    """The Ray token in KubeRay's Secret (``data.auth_token``, base64); raises :class:`RayTokenMissingError`."""
    encoded = ((secret or {}).get("data") or {}).get(RAY_TOKEN_KEY) if isinstance(secret, Mapping) else None
    try:
        token = base64.b64decode(str(encoded or ""), validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise RayTokenMissingError(
            f"the RayCluster authenticates with a Ray token, but {path} "
            f"{'does not exist' if secret is None else f'has no {RAY_TOKEN_KEY}'}. KubeRay 1.5.1 or later creates it "
            "for a RayCluster with authOptions {mode: token}: upgrade KubeRay, or check its operator log"
        )
    return token


class _NoSecretBodies(logging.Filter):
    """Drops a kubernetes client's DEBUG record of a Secret's body: base64 masks nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        body = record.args[0] if isinstance(record.args, tuple) and record.args else b""
        body = body.encode("utf-8", "replace") if isinstance(body, str) else body
        return not (record.msg == "response body: %s" and isinstance(body, bytes) and _SECRET_BODY.search(body))


def hide_secret_bodies() -> None:
    """Keep the kubernetes clients from logging the body of a Secret (the Ray token's) at DEBUG; idempotent."""
    for name in KUBE_REST_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoSecretBodies) for f in logger.filters):
            logger.addFilter(_NoSecretBodies())


def ray_token_headers(token: str | None) -> dict[str, str]:
    """The header that carries the Ray token to Ray (none without a token)."""
    return {RAY_TOKEN_HEADER: f"Bearer {token}"} if token else {}


def resolve_secrets(
    request: JobRequest, password_of: Callable[[str], str | None], deployment: Deployment | None = None
) -> dict[str, str]:
    """The secret env vars of ``request``, read through ``password_of(conn_id)``; raises when one is missing.

    Every connection is checked against ``deployment`` (None: the defaults) before anything is read, so a request
    naming any other connection raises :class:`ConnectionNotAllowedError` and reads nothing.
    """
    allowed = allowed_secret_conn_ids(deployment or Deployment())
    for secret in request.secrets:
        if secret.conn_id not in allowed.get(secret.name, ()):
            raise ConnectionNotAllowedError(
                f"the job's {secret.name} may be read only from {', '.join(allowed.get(secret.name, ())) or 'no'} "
                "connection(s) of this deployment; nothing was read"
            )
    values = {}
    for secret in request.secrets:
        value = password_of(secret.conn_id)
        if not value:
            raise SecretMissingError(
                f"the job needs {secret.name} from the password of Airflow connection '{secret.conn_id}', which is "
                "missing or empty. Fix: create the connection (UI, CLI, AIRFLOW_CONN_* or the secrets backend) with "
                "the token as its password"
            )
        values[secret.name] = value
    return values


def ray_token_source(spec: RunSpec) -> dict[str, str]:
    """The trigger kwargs that say where the Ray token is (the Secret's cluster and path, never its value), or none
    when the recipe's Ray has no token auth (its RayCluster has no ``authOptions``)."""
    if not load_recipe(spec.recipe).version.ray_token_auth:
        return {}
    return {
        "cluster_path": spec.cluster_path,
        "ray_token_secret": ray_token_secret_path(spec.namespace, spec.raycluster_name),
    }
