"""Run the sandbox for tests: a subprocess on a free 127.0.0.1 port, and small clients for its admin API.

::

    sandbox = sandbox_fixture(scope="module")          # in a conftest.py or test module

    def test_something(sandbox, monkeypatch):
        sandbox.reset()
        sandbox.add_fault({"method": "POST", "path": "/global/networks$"}, status=503)
        client = compute_v1.NetworksClient(credentials=sandbox.credentials(),
                                           client_options={"api_endpoint": sandbox.url})
        monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox.connection_json("my-project"))

The sandbox refuses every Google API and Kubernetes call without a bearer token it issued, so the helpers here get one
the way production does: the sandbox's service-account key file (``/sandbox/credentials``) and google-auth's real
JWT grant against its ``token_uri``. :func:`request_json` adds that token to every call outside ``/sandbox/``.

Only the standard library is imported at module level (google-auth lazily, pytest only inside
:func:`sandbox_fixture`), so anything can import it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from sandbox.ports import free_port

HOST = "127.0.0.1"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_SECONDS = 30.0
# Stopping the sandbox stops its Ray heads first (a few seconds each).
STOP_TIMEOUT_SECONDS = 40.0


class SandboxError(RuntimeError):
    """The sandbox did not start, or an admin call failed."""


def request_json(
    url: str, method: str = "GET", body: Any = None, timeout: float = 30.0, *, authenticated: bool | None = None
) -> Any:
    """One JSON HTTP call (admin API or raw API); raises :class:`SandboxError` with the body on an HTTP error.

    A call outside ``/sandbox/`` carries the sandbox's bearer token unless ``authenticated=False``.
    """
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    parts = urlsplit(url)
    if authenticated if authenticated is not None else not parts.path.startswith("/sandbox/"):
        headers.update(auth_headers(f"{parts.scheme}://{parts.netloc}"))
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        raise SandboxError(f"{method} {url} -> {exc.code}: {exc.read().decode(errors='replace')}") from exc
    return json.loads(text) if text else None


# ---------------------------------------------------------------------------------------------------------------------
# Credentials: the sandbox's service-account key, its tokens, and the Airflow connection that uses them
# ---------------------------------------------------------------------------------------------------------------------
_CREDENTIALS: dict[str, Any] = {}


def key_file(url: str) -> dict[str, str]:
    """The sandbox's service-account JSON key file (``token_uri`` is its own token endpoint)."""
    return dict(request_json(f"{url}/sandbox/credentials"))


def credentials(url: str) -> Any:
    """google-auth service-account credentials from the sandbox's key file (cloud-platform scope), one per URL."""
    if url not in _CREDENTIALS:
        from google.oauth2 import service_account

        info = key_file(url)
        _CREDENTIALS[url] = service_account.Credentials.from_service_account_info(info, scopes=[CLOUD_PLATFORM])
    return _CREDENTIALS[url]


def bearer_token(url: str) -> str:
    """A valid access token from the sandbox at ``url``: google-auth's JWT grant, redone once it has expired."""
    import google.auth.transport.requests

    creds = credentials(url)
    if not creds.valid:
        creds.refresh(google.auth.transport.requests.Request())
    return str(creds.token)


def auth_headers(url: str) -> dict[str, str]:
    """``{"Authorization": "Bearer ..."}`` for a raw call to the sandbox at ``url``."""
    return {"Authorization": f"Bearer {bearer_token(url)}"}


def connection_extra(url: str, project: str) -> dict[str, str]:
    """The extras of a ``google_cloud_platform`` connection that reaches the sandbox with its service-account key."""
    return {"keyfile_dict": json.dumps(key_file(url)), "project": project, "api_endpoint": url}


def connection_json(extra: dict[str, Any]) -> str:
    """An ``AIRFLOW_CONN_...`` value (JSON) for a ``google_cloud_platform`` connection with ``extra``."""
    return json.dumps({"conn_type": "google_cloud_platform", "extra": extra})


def auth_status(url: str) -> dict[str, Any]:
    """Token lifetime and tokens issued (``GET /sandbox/auth``)."""
    return dict(request_json(f"{url}/sandbox/auth"))


def set_token_lifetime(url: str, seconds: float) -> dict[str, Any]:
    """Change the lifetime of tokens issued (and self-signed JWTs checked) from now on."""
    return dict(request_json(f"{url}/sandbox/auth", "POST", {"token_lifetime_s": seconds}))


def unauthenticated_calls(url: str, since: int = 0) -> list[dict[str, Any]]:
    """Every logged call that came without a valid bearer token."""
    return [c for c in calls(url, since) if c.get("auth") != "valid"]


# ---------------------------------------------------------------------------------------------------------------------
# Admin API helpers (each takes the sandbox URL)
# ---------------------------------------------------------------------------------------------------------------------
def add_fault(
    url: str,
    match: dict[str, str],
    *,
    nth: int = 1,
    times: int | None = 1,
    status: int | None = None,
    operation: str | None = None,
    delay_s: float | None = None,
    message: str | None = None,
    error_status: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Install a fault: fail the ``nth`` matching call with ``status``, end/hang (``operation``) its operation, or
    hold its answer ``delay_s`` seconds after the call took effect; ``reason`` is the body's ``errors[].reason``
    (e.g. ``rateLimitExceeded`` on a 403)."""
    spec: dict[str, Any] = {"match": match, "nth": nth, "times": times}
    for key, value in (
        ("status", status),
        ("operation", operation),
        ("delay_s", delay_s),
        ("message", message),
        ("error_status", error_status),
        ("reason", reason),
    ):
        if value is not None:
            spec[key] = value
    return request_json(f"{url}/sandbox/faults", "POST", spec)


def faults(url: str) -> list[dict[str, Any]]:
    """The installed faults with their counters."""
    return request_json(f"{url}/sandbox/faults")["faults"]


def clear_faults(url: str) -> None:
    """Uninstall every fault."""
    request_json(f"{url}/sandbox/faults", "DELETE")


def lose_node(
    url: str,
    raycluster: str,
    *,
    mode: str = "killed",
    replace_after_s: float = 5.0,
    after_save: int | None = None,
    notice_s: float = 30.0,
) -> dict[str, Any]:
    """Lose one worker node of ``raycluster`` (killed, frozen, preempted with ``notice_s``, or ended), now or once
    checkpoint ``step_{after_save}`` is saved; the node pool replaces it after ``replace_after_s``."""
    spec: dict[str, Any] = {"raycluster": raycluster, "mode": mode, "replace_after_s": replace_after_s}
    if mode == "preempted":
        spec["notice_s"] = notice_s
    if after_save is not None:
        spec["after_save"] = after_save
    return request_json(f"{url}/sandbox/node-loss", "POST", spec)


def capacity(url: str) -> dict[str, Any]:
    """The GPU capacity model: settings, the nodes made per pool, each reservation's free machines."""
    return request_json(f"{url}/sandbox/capacity")


def set_capacity(url: str, **settings: Any) -> dict[str, Any]:
    """Change the capacity model's settings (flex_start_delay_s, spot_stockout, on_demand_stockout)."""
    return request_json(f"{url}/sandbox/seed", "POST", {"capacity": settings})


def node_losses(url: str) -> list[dict[str, Any]]:
    """Every node loss asked for: state (armed, lost, replaced), the pods, when it was lost and replaced."""
    return request_json(f"{url}/sandbox/node-loss")["node_losses"]


def inventory(url: str) -> list[dict[str, Any]]:
    """Every live resource: kind, name, path, state, phase, labels, description, operation."""
    return request_json(f"{url}/sandbox/inventory")["resources"]


def full_inventory(url: str) -> dict[str, Any]:
    """The whole inventory: GCP ``resources``, ``kubernetes`` objects, ``ray_heads`` (with PIDs) and ``seeded``."""
    return dict(request_json(f"{url}/sandbox/inventory"))


def pid_alive(pid: int) -> bool:
    """Whether a process (say a sandbox Ray head) still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def calls(url: str, since: int = 0) -> list[dict[str, Any]]:
    """The API call log (method, path, query, status, time, operations started, fault)."""
    return request_json(f"{url}/sandbox/calls?since={since}")["calls"]


def operations(url: str) -> list[dict[str, Any]]:
    """Every operation, service-neutral (id, service, kind, target, outcome, status, start, end)."""
    return request_json(f"{url}/sandbox/operations")["operations"]


# Positional, as its callers write it (project, zone, name, machine type, count).
def seed_reservation(  # noqa: PLR0917
    url: str, project: str, zone: str, name: str, machine_type: str, count: int, in_use_count: int = 0
) -> dict[str, Any]:
    """Add (or replace) a specific reservation; answers it as compute renders it."""
    body = {
        "project": project,
        "zone": zone,
        "name": name,
        "machine_type": machine_type,
        "count": count,
        "in_use_count": in_use_count,
    }
    return request_json(f"{url}/sandbox/reservations", "POST", body)


def seed(url: str, document: dict[str, Any]) -> None:
    """Apply a seed document (roce_zones, enabled_services, reservations, latency_seconds, buckets, ...) now."""
    request_json(f"{url}/sandbox/seed", "POST", document)


def seed_bucket(url: str, project: str, name: str | None = None) -> None:
    """Make a project's export bucket exist (default: RunSpec's derived ``{project}-nemo-rl-checkpoints``), writable
    by the project's Lustre service agent, as a user would set it up before a run."""
    bucket = {"project": project, "name": name or f"{project}-nemo-rl-checkpoints"}
    seed(url, {"buckets": [{**bucket, "lustre_agent_role": "roles/storage.objectUser"}]})


def set_latency(
    url: str, scale: float | None = None, seconds: dict[str, float] | None = None, defaults: bool = False
) -> dict[str, Any]:
    """Change the latency scale and/or per-kind seconds for operations started from now on.

    ``defaults`` first drops every per-kind override, back to the built-in table.
    """
    body: dict[str, Any] = {} if scale is None else {"scale": scale}
    if defaults:
        body["defaults"] = True
    if seconds:
        body["seconds"] = seconds
    return request_json(f"{url}/sandbox/latency", "POST", body)


def reset(url: str) -> None:
    """Forget every resource, operation, fault and call (the seeded config stays)."""
    request_json(f"{url}/sandbox/reset", "POST", {})


# ---------------------------------------------------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------------------------------------------------
class SandboxProcess:
    """A running ``python -m sandbox serve``: its URL, state dir and PID; stop it with :meth:`stop`."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, state_dir: Path, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.state_dir = state_dir
        self.log_path = log_path
        self.url = f"http://{HOST}:{port}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process.poll() is None

    def log(self) -> str:
        """What the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM by PID, wait, SIGKILL if it does not go; returns the exit code."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_SECONDS)
        return self.process.returncode

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # Admin helpers bound to this sandbox.
    def add_fault(self, match: dict[str, str], **spec: Any) -> dict[str, Any]:
        """See :func:`add_fault`."""
        return add_fault(self.url, match, **spec)

    def faults(self) -> list[dict[str, Any]]:
        """See :func:`faults`."""
        return faults(self.url)

    def clear_faults(self) -> None:
        """See :func:`clear_faults`."""
        clear_faults(self.url)

    def lose_node(self, raycluster: str, **spec: Any) -> dict[str, Any]:
        """See :func:`lose_node`."""
        return lose_node(self.url, raycluster, **spec)

    def capacity(self) -> dict[str, Any]:
        """See :func:`capacity`."""
        return capacity(self.url)

    def set_capacity(self, **settings: Any) -> dict[str, Any]:
        """See :func:`set_capacity`."""
        return set_capacity(self.url, **settings)

    def node_losses(self) -> list[dict[str, Any]]:
        """See :func:`node_losses`."""
        return node_losses(self.url)

    def inventory(self) -> list[dict[str, Any]]:
        """See :func:`inventory`."""
        return inventory(self.url)

    def full_inventory(self) -> dict[str, Any]:
        """See :func:`full_inventory`."""
        return full_inventory(self.url)

    def calls(self, since: int = 0) -> list[dict[str, Any]]:
        """See :func:`calls`."""
        return calls(self.url, since)

    def operations(self) -> list[dict[str, Any]]:
        """See :func:`operations`."""
        return operations(self.url)

    def seed_reservation(  # noqa: PLR0917
        self, project: str, zone: str, name: str, machine_type: str, count: int, in_use_count: int = 0
    ) -> dict[str, Any]:
        """See :func:`seed_reservation`."""
        return seed_reservation(
            self.url, project, zone, name, machine_type=machine_type, count=count, in_use_count=in_use_count
        )

    def seed(self, document: dict[str, Any]) -> None:
        """See :func:`seed`."""
        seed(self.url, document)

    def seed_bucket(self, project: str, name: str | None = None) -> None:
        """See :func:`seed_bucket`."""
        seed_bucket(self.url, project, name)

    def set_latency(
        self, scale: float | None = None, seconds: dict[str, float] | None = None, defaults: bool = False
    ) -> dict[str, Any]:
        """See :func:`set_latency`."""
        return set_latency(self.url, scale, seconds, defaults)

    def reset(self) -> None:
        """See :func:`reset`."""
        reset(self.url)

    def key_file(self) -> dict[str, str]:
        """See :func:`key_file`."""
        return key_file(self.url)

    def credentials(self) -> Any:
        """See :func:`credentials`."""
        return credentials(self.url)

    def token(self) -> str:
        """See :func:`bearer_token`."""
        return bearer_token(self.url)

    def auth_headers(self) -> dict[str, str]:
        """See :func:`auth_headers`."""
        return auth_headers(self.url)

    def connection_extra(self, project: str) -> dict[str, str]:
        """See :func:`connection_extra`."""
        return connection_extra(self.url, project)

    def connection_json(self, project: str) -> str:
        """The ``AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT`` value that reaches this sandbox as ``project``."""
        return connection_json(connection_extra(self.url, project))

    def auth_status(self) -> dict[str, Any]:
        """See :func:`auth_status`."""
        return auth_status(self.url)

    def set_token_lifetime(self, seconds: float) -> dict[str, Any]:
        """See :func:`set_token_lifetime`."""
        return set_token_lifetime(self.url, seconds)

    def unauthenticated_calls(self, since: int = 0) -> list[dict[str, Any]]:
        """See :func:`unauthenticated_calls`."""
        return unauthenticated_calls(self.url, since)


def _healthy(url: str) -> bool:
    try:
        return request_json(f"{url}/sandbox/health", timeout=2.0).get("status") == "ok"
    except (OSError, SandboxError, ValueError):
        return False


def start_sandbox(
    state_dir: Path | str,
    latency_scale: float = 0.0,
    seed: Path | str | dict[str, Any] | None = None,
    port: int | None = None,
    token_lifetime_s: float | None = None,
) -> SandboxProcess:
    """Start ``python -m sandbox serve`` on a free 127.0.0.1 port and wait until ``/sandbox/health`` answers.

    ``seed`` is a seed file, or a seed document (written to ``state_dir/seed.json``). The server's output goes to
    ``state_dir/sandbox.log``.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "sandbox",
        "serve",
        "--state",
        str(state_dir),
        "--latency-scale",
        str(latency_scale),
    ]
    if isinstance(seed, dict):
        seed_path = state_dir / "seed.json"
        seed_path.write_text(json.dumps(seed), encoding="utf-8")
        seed = seed_path
    if seed is not None:
        command += ["--seed", str(seed)]
    if token_lifetime_s is not None:
        command += ["--token-lifetime", str(token_lifetime_s)]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    log_path = state_dir / "sandbox.log"
    chosen = port or free_port()
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*command, "--port", str(chosen)], cwd=REPO_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    running = SandboxProcess(process, chosen, state_dir, log_path)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if not running.running():
            raise SandboxError(f"sandbox exited with {process.returncode}:\n{running.log()}")
        if _healthy(running.url):
            return running
        time.sleep(0.05)
    running.stop()
    raise SandboxError(f"sandbox did not answer /sandbox/health within {START_TIMEOUT_SECONDS}s:\n{running.log()}")


def sandbox_fixture(
    *,
    scope: str = "session",
    latency_scale: float = 0.0,
    seed: Path | str | dict[str, Any] | None = None,
    name: str = "sandbox",
) -> Callable[..., Iterator[SandboxProcess]]:
    """A pytest fixture (assign it to a module-level name) that runs one sandbox per ``scope`` in a temp dir."""
    import pytest

    @pytest.fixture(scope=scope, name=name)  # type: ignore[misc]
    def running_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
        with start_sandbox(tmp_path_factory.mktemp(name), latency_scale, seed) as running:
            yield running

    return running_sandbox
