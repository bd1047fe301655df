"""The sandbox refuses what Google refuses: every API family and each cluster's Kubernetes API answer 401 without a
valid, unexpired bearer token the sandbox issued; its token endpoint runs google-auth's real JWT grant; ``/sandbox/``
stays open."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import google.auth.transport.requests
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt, jwt
from google.oauth2 import service_account
from sandbox.auth import JWT_BEARER, MESSAGE_INVALID, MESSAGE_MISSING, TOKEN_PATH
from sandbox.testing import CLOUD_PLATFORM, REPO_ROOT, SandboxProcess, start_sandbox

from nemo_rl_gke.plan import peering
from tests.sandbox.conftest import PROJECT, REGION, SPEC, ZONE, Clients
from tests.sandbox.helpers import create_cluster, create_networks

# One GET per API family the sandbox serves, and what it answers with a valid token.
FAMILIES = {
    "compute": (f"/compute/v1/projects/{PROJECT}/global/networks", 200),
    "container": (f"/v1/projects/{PROJECT}/locations/{REGION}/clusters", 200),
    "lustre": (f"/v1/projects/{PROJECT}/locations/{ZONE}/instances", 200),
    "servicenetworking": (
        f"/v1/{peering.SERVICE_PARENT}/connections?network="
        + urllib.parse.quote(f"projects/123/global/networks/{SPEC.network}"),
        200,
    ),
    "resourcemanager": (f"/v1/projects/{PROJECT}", 200),
    "serviceusage": (f"/v1/projects/{PROJECT}/services/lustre.googleapis.com", 200),
    # Not served by the sandbox (yet): authenticated first all the same, so a valid token gets the 404.
    "storage": ("/storage/v1/b/some-bucket/o", 404),
}


def _get(
    url: str, authorization: str | None = None, method: str = "GET", context: ssl.SSLContext | None = None
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": authorization} if authorization is not None else {}
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, json.loads(response.read() or b"null"), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def _post_form(url: str, form: dict[str, str]) -> tuple[int, Any]:
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _fresh_token(sandbox: SandboxProcess) -> str:
    """A token from a new JWT grant (not the helpers' cached one)."""
    creds = service_account.Credentials.from_service_account_info(sandbox.key_file(), scopes=[CLOUD_PLATFORM])
    creds.refresh(google.auth.transport.requests.Request())
    return str(creds.token)


def _other_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _signed(pem: str, key_id: str, claims: dict[str, Any]) -> str:
    return jwt.encode(crypt.RSASigner.from_string(pem, key_id), claims).decode()


@pytest.fixture
def expired_token(sandbox: SandboxProcess) -> Iterator[str]:
    """A token the sandbox issued with a one-second lifetime, once that second is over."""
    sandbox.set_token_lifetime(1)
    try:
        token = _fresh_token(sandbox)
    finally:
        sandbox.set_token_lifetime(3600)
    time.sleep(1.2)
    yield token


def _assert_google_401(status: int, body: Any, headers: dict[str, str], missing: bool, reason: str) -> None:
    assert status == 401, body
    error = body["error"]
    assert error["code"] == 401 and error["status"] == "UNAUTHENTICATED"
    assert error["message"] == (MESSAGE_MISSING if missing else MESSAGE_INVALID)
    assert error["errors"][0]["reason"] == ("required" if missing else "authError")
    assert error["errors"][0]["location"] == "Authorization"
    assert error["details"][0]["reason"] == reason
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_api_family_refuses_a_missing_wrong_or_expired_token_with_googles_401(
    sandbox: SandboxProcess, family: str, expired_token: str
) -> None:
    path, ok = FAMILIES[family]
    url = sandbox.url + path
    _assert_google_401(*_get(url), missing=True, reason="CREDENTIALS_MISSING")
    _assert_google_401(*_get(url, "Bearer ya29.not-a-token"), missing=False, reason="ACCESS_TOKEN_TYPE_UNSUPPORTED")
    _assert_google_401(*_get(url, "Basic dXNlcjpwYXNz"), missing=False, reason="ACCESS_TOKEN_TYPE_UNSUPPORTED")
    _assert_google_401(*_get(url, f"Bearer {expired_token}"), missing=False, reason="ACCESS_TOKEN_EXPIRED")
    status, body, _ = _get(url, f"Bearer {_fresh_token(sandbox)}")
    assert status == ok, body
    verdicts = [c["auth"] for c in sandbox.calls() if c["path"] == path.split("?")[0]]
    assert verdicts == ["missing", "invalid", "invalid", "expired", "valid"]


def test_a_self_signed_jwt_counts_only_when_signed_by_the_issued_key_and_within_the_lifetime(
    sandbox: SandboxProcess,
) -> None:
    key = sandbox.key_file()
    url = sandbox.url + FAMILIES["compute"][0]
    now = int(time.time())
    claims = {"iss": key["client_email"], "sub": key["client_email"], "scope": CLOUD_PLATFORM}
    good = _signed(key["private_key"], key["private_key_id"], {**claims, "iat": now, "exp": now + 3600})
    assert _get(url, f"Bearer {good}")[0] == 200
    forged = _signed(_other_key_pem(), key["private_key_id"], {**claims, "iat": now, "exp": now + 3600})
    _assert_google_401(*_get(url, f"Bearer {forged}"), missing=False, reason="ACCESS_TOKEN_TYPE_UNSUPPORTED")
    # Valid from iat for the token lifetime only, whatever exp says.
    sandbox.set_token_lifetime(60)
    try:
        old = _signed(key["private_key"], key["private_key_id"], {**claims, "iat": now - 120, "exp": now + 3000})
        _assert_google_401(*_get(url, f"Bearer {old}"), missing=False, reason="ACCESS_TOKEN_EXPIRED")
    finally:
        sandbox.set_token_lifetime(3600)


def test_the_kubernetes_api_and_the_service_proxy_answer_unauthorized_without_a_valid_token(
    sandbox: SandboxProcess, clients: Clients, expired_token: str
) -> None:
    create_networks(clients)
    create_cluster(clients)
    cluster = clients.gke.get_cluster(name=SPEC.cluster_path)
    endpoint = f"https://{cluster.endpoint}"
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster.master_auth.cluster_ca_certificate).decode())
    proxy = "/api/v1/namespaces/default/services/ray-head:8265/proxy/api/version"
    token = _fresh_token(sandbox)
    for path in ("/api/v1/namespaces", proxy):
        for authorization in (None, "Bearer nope", f"Bearer {expired_token}"):
            status, body, _ = _get(endpoint + path, authorization, context=tls)
            assert status == 401, (path, authorization, body)
            assert body == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            }
    status, body, _ = _get(endpoint + "/api/v1/namespaces", f"Bearer {token}", context=tls)
    assert status == 200 and body["kind"] == "NamespaceList"
    # Past authentication, the proxy looks for the service (there is none here).
    status, body, _ = _get(endpoint + proxy, f"Bearer {token}", context=tls)
    assert status == 404 and body["reason"] == "NotFound"
    kube = [c for c in sandbox.calls() if c["service"] == "kubernetes"]
    assert [c["auth"] for c in kube] == ["missing", "invalid", "expired"] * 2 + ["valid", "valid"]


def test_admin_routes_stay_open_and_the_call_log_never_holds_a_token(sandbox: SandboxProcess) -> None:
    token = _fresh_token(sandbox)
    _get(sandbox.url + FAMILIES["compute"][0], f"Bearer {token}")
    for path in ("/sandbox/health", "/sandbox/inventory", "/sandbox/calls", "/sandbox/credentials", "/sandbox/auth"):
        status, body, _ = _get(sandbox.url + path)
        assert status == 200, (path, body)
    request = urllib.request.Request(sandbox.url + "/sandbox/seed", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    logged = json.dumps(sandbox.calls())
    assert token not in logged and token.split(".")[-1] not in logged


def test_the_token_endpoint_runs_the_jwt_grant_and_refuses_as_google_does(sandbox: SandboxProcess) -> None:
    key = sandbox.key_file()
    assert key["type"] == "service_account" and key["token_uri"] == sandbox.url + TOKEN_PATH
    token_uri = key["token_uri"]
    now = int(time.time())
    claims = {
        "iss": key["client_email"],
        "aud": "https://oauth2.googleapis.com/token",
        "scope": CLOUD_PLATFORM,
        "iat": now,
        "exp": now + 3600,
    }
    assertion = _signed(key["private_key"], key["private_key_id"], claims)
    status, body = _post_form(token_uri, {"grant_type": JWT_BEARER, "assertion": assertion})
    assert status == 200, body
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600 and body["access_token"]
    assert _get(sandbox.url + FAMILIES["compute"][0], f"Bearer {body['access_token']}")[0] == 200

    refusals = {
        "unsupported_grant_type": {"grant_type": "client_credentials", "assertion": assertion},
        "invalid_grant": {
            "grant_type": JWT_BEARER,
            "assertion": _signed(_other_key_pem(), key["private_key_id"], claims),
        },
    }
    for error, form in refusals.items():
        status, body = _post_form(token_uri, form)
        assert (status, body["error"]) == (400, error), body
        assert body["error_description"]
    stale = _signed(key["private_key"], key["private_key_id"], {**claims, "iat": now - 7200, "exp": now - 3600})
    status, body = _post_form(token_uri, {"grant_type": JWT_BEARER, "assertion": stale})
    assert (status, body["error"]) == (400, "invalid_grant") and "iat and exp" in body["error_description"]
    wrong_audience = _signed(key["private_key"], key["private_key_id"], {**claims, "aud": "https://example.com/"})
    status, body = _post_form(token_uri, {"grant_type": JWT_BEARER, "assertion": wrong_audience})
    assert (status, body["error"]) == (400, "invalid_grant") and "audience" in body["error_description"]


def test_the_key_and_its_tokens_survive_a_restart(tmp_path: Any) -> None:
    with start_sandbox(tmp_path) as first:
        key = first.key_file()
        token = _fresh_token(first)
    with start_sandbox(tmp_path) as second:
        assert second.key_file()["private_key_id"] == key["private_key_id"]
        assert _get(second.url + FAMILIES["compute"][0], f"Bearer {token}")[0] == 200
    assert (tmp_path / "auth" / "key.json").stat().st_mode & 0o077 == 0


def test_the_credentials_command_writes_the_key_and_prints_a_connection_that_reaches_the_sandbox(
    sandbox: SandboxProcess, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sandbox-key.json"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "credentials", "--url", sandbox.url, "--out", str(out), "--project", PROJECT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.read_text())["private_key_id"] == sandbox.key_file()["private_key_id"]
    assert out.stat().st_mode & 0o077 == 0
    connection = json.loads(done.stdout)
    assert connection["extra"] == {"key_path": str(out), "project": PROJECT, "api_endpoint": sandbox.url}
    assert "PRIVATE KEY" not in done.stdout + done.stderr
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", done.stdout.strip())
    from nemo_rl_gke.gcp.hooks import GcpHook

    assert GcpHook().project_number(PROJECT).isdigit()
    assert [c["auth"] for c in sandbox.calls()] == ["valid"]
