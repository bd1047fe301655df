"""``kubectl`` access to a sandbox GKE cluster, written as ``gcloud container clusters get-credentials`` writes it.

gcloud adds a cluster, a user and a context named ``gke_PROJECT_LOCATION_CLUSTER`` to the kubeconfig: the server is
``https://`` + the cluster's ``endpoint``, the CA is its ``masterAuth.clusterCaCertificate``, and the user runs the
``gke-gcloud-auth-plugin`` exec plugin, which prints an ``ExecCredential`` with a Google access token (GKE's
"kubectl authentication" page). Here the plugin is ``python -m sandbox auth-plugin --key KEYFILE``: it runs
google-auth's real JWT-bearer grant against the sandbox's token endpoint, so no token is ever written to the file.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

import yaml

EXEC_API = "client.authentication.k8s.io/v1beta1"
REPO_ROOT = Path(__file__).resolve().parent.parent


def context_name(project: str, location: str, cluster: str) -> str:
    """gcloud's name for the cluster, user and context: ``gke_PROJECT_LOCATION_CLUSTER``."""
    return f"gke_{project}_{location}_{cluster}"


def entry(cluster: dict[str, Any], project: str, location: str, key_path: Path) -> dict[str, Any]:
    """The kubeconfig (one cluster, user and context) for a running GKE cluster as ``clusters.get`` returns it."""
    endpoint = cluster.get("endpoint") or ""
    ca = (cluster.get("masterAuth") or {}).get("clusterCaCertificate") or ""
    if not endpoint or not ca:
        status = cluster.get("status")
        raise ValueError(f"cluster {cluster.get('name')} is not running (no endpoint or CA yet): {status}")
    name = context_name(project, location, str(cluster["name"]))
    plugin = {
        "apiVersion": EXEC_API,
        "command": sys.executable,
        "args": ["-m", "sandbox", "auth-plugin", "--key", str(key_path.resolve())],
        "env": [{"name": "PYTHONPATH", "value": str(REPO_ROOT)}],
        "installHint": "the sandbox's stand-in for gke-gcloud-auth-plugin: python -m sandbox auth-plugin",
        "interactiveMode": "Never",
        "provideClusterInfo": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": name, "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca}}],
        "users": [{"name": name, "user": {"exec": plugin}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def merge(existing: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s entries added to (or replacing the same-named ones of) an existing kubeconfig, made current, as
    gcloud does; the file's other clusters, users and contexts stay."""
    out = dict(existing or {})
    for section in ("clusters", "users", "contexts"):
        names = {item["name"] for item in new[section]}
        kept = [item for item in out.get(section) or [] if item.get("name") not in names]
        out[section] = kept + new[section]
    for key in ("apiVersion", "kind"):
        out.setdefault(key, new[key])
    out.setdefault("preferences", {})
    out["current-context"] = new["current-context"]
    return out


def write(path: Path, new: dict[str, Any]) -> None:
    """Merge ``new`` into the kubeconfig at ``path`` (created, mode 0600, like kubectl's own)."""
    existing = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(yaml.safe_dump(merge(existing, new), sort_keys=False), encoding="utf-8")


def exec_credential(key_path: Path) -> dict[str, Any]:
    """What the auth plugin prints: an ``ExecCredential`` with a fresh access token from the key's token endpoint."""
    import google.auth.transport.requests
    from google.oauth2 import service_account

    info = json.loads(key_path.read_text(encoding="utf-8"))
    creds = service_account.Credentials.from_service_account_info(
        info, scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    creds.refresh(google.auth.transport.requests.Request())
    status: dict[str, Any] = {"token": creds.token}
    if creds.expiry is not None:
        expiry = creds.expiry.replace(tzinfo=UTC) if creds.expiry.tzinfo is None else creds.expiry
        status["expirationTimestamp"] = expiry.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": EXEC_API, "kind": "ExecCredential", "spec": {"interactive": False}, "status": status}
