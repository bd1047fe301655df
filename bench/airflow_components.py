"""Airflow's components on 127.0.0.1 with a private AIRFLOW_HOME: what the benches and the browser tests run.

``airflow standalone`` runs a scheduler (LocalExecutor), a triggerer, a dag-processor and an API server after
``airflow db migrate``; :func:`start_airflow` runs the same four, bound to 127.0.0.1 only, in one new session and
process group that :func:`stop_airflow` stops as a whole (never anything else: it kills by session id). The
``google_cloud_default`` connection points at a sandbox; the job's secret connections hold placeholders unless the
caller passes its own. :func:`running_airflow` wraps start, readiness and stop for a ``with`` block or a fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.ports import free_port
from sandbox.testing import SandboxError, connection_extra

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "nemo_rl_grpo_gke"
HOST = "127.0.0.1"

# The tuned Airflow settings, one file for the README's local guide, the benches and the browser tests (each
# setting's reason is beside it there).
TUNING_FILE = ROOT / "include" / "conf" / "local-airflow.env"


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a shell env file (``#`` comments and blank lines skipped; values taken literally)."""
    settings = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: not KEY=VALUE: {raw!r}")
            settings[key] = value
    return settings


AIRFLOW_TUNING = read_env_file(TUNING_FILE)


class AirflowStartError(RuntimeError):
    """Something Airflow or the bench depends on did not start or answer in time."""


# The benches' name for it.
BenchError = AirflowStartError


# ---------------------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------------------
def http_json(
    url: str, method: str = "GET", body: Any = None, token: str | None = None, timeout: float = 30.0
) -> tuple[int, Any]:
    """One JSON call to 127.0.0.1; returns (status, parsed body or text)."""
    if not url.startswith(f"http://{HOST}:"):
        raise AirflowStartError(f"refusing to call {url}: the bench talks to {HOST} only")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.5) -> Any:
    """Call ``check()`` until it returns something truthy; AirflowStartError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, urllib.error.URLError) as exc:
            last = None
            error = exc
        else:
            error = None
            if last:
                return last
        time.sleep(interval)
    raise AirflowStartError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last or error})")


# ---------------------------------------------------------------------------------------------------------------------
# Airflow (the components of airflow standalone)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Airflow:
    """The running Airflow components, all in one session and process group led by ``process``."""

    process: subprocess.Popen[bytes]
    home: Path
    port: int
    log_dir: Path
    token: str = ""

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def api(self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200,)) -> Any:
        status, answer = http_json(f"{self.url}{path}", method, body, self.token)
        if status not in expect:
            raise AirflowStartError(f"{method} {path} -> {status}: {str(answer)[:800]}")
        return answer

    def log_tail(self, lines: int = 25) -> str:
        parts = []
        for name in ("components", "db-migrate", "scheduler", "triggerer", "dag-processor", "api-server"):
            path = self.log_dir / f"{name}.log"
            if path.exists():
                text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}.log (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(parts)


def session_pids(sid: int) -> list[int]:
    """PIDs alive in session ``sid``: everything the bench's Airflow started (it is its own session), nothing else."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def component_pids(airflow: Airflow, component: str) -> list[int]:
    """The PIDs of one Airflow component (``airflow triggerer``: its process and the subprocesses it forked),
    found in the stack's own session only."""
    pids = []
    for pid in session_pids(airflow.process.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # The supervising bash's script names every component too: only a process running airflow itself counts.
        runs_airflow = any(Path(arg).name == "airflow" for arg in argv[:2])
        if runs_airflow and component in argv[1:4]:
            pids.append(pid)
    return pids


def task_runner_pid(airflow: Airflow, ti_id: str) -> int | None:
    """The PID of the process running task instance ``ti_id`` (the Task SDK titles it ``airflow worker -- <ti
    id>``; its supervisor, the executor's worker, is its parent), or None when none runs it now."""
    for pid in session_pids(airflow.process.pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if title.replace("\0", " ").strip() == f"airflow worker -- {ti_id}":
            return pid
    return None


def kill_component(airflow: Airflow, component: str) -> list[int]:
    """SIGKILL one component (``scheduler``, ``triggerer``, ...), as a crash or an OOM kill would end it; its
    supervisor starts it again a second later. The PIDs killed."""
    pids = running_pids(airflow, component)
    signal_pids(pids, signal.SIGKILL)
    return pids


def running_pids(airflow: Airflow, component: str) -> list[int]:
    """:func:`component_pids`, and an error naming the component (with the stack's log tail) when none runs."""
    pids = component_pids(airflow, component)
    if not pids:
        raise AirflowStartError(f"no airflow {component} process is running\n{airflow.log_tail()}")
    return pids


def signal_pids(pids: list[int], signum: signal.Signals) -> None:
    """Send ``signum`` to each PID; one that has exited meanwhile is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def kill_component_when(
    airflow: Airflow, component: str, ready: Callable[[], bool], attempts: int = 50, pause_s: float = 0.2
) -> list[int]:
    """SIGKILL a component at a moment ``ready`` accepts: each attempt freezes it (SIGSTOP), asks ``ready`` about
    the state it froze in, and kills it there, or lets it run on (SIGCONT) for ``pause_s`` and tries again. So a
    test can kill a triggerer between two of its writes instead of wherever the signal happens to land."""
    for _ in range(attempts):
        pids = running_pids(airflow, component)
        signal_pids(pids, signal.SIGSTOP)
        killed = False
        try:
            killed = ready()
        finally:
            signal_pids(pids, signal.SIGKILL if killed else signal.SIGCONT)
        if killed:
            return pids
        time.sleep(pause_s)
    raise AirflowStartError(f"the {component} was never in a state to kill in {attempts} attempts")


def stop_airflow(airflow: Airflow, grace: float = 20.0) -> None:
    """SIGTERM the Airflow process group, then SIGKILL whatever is left in its session."""
    pid = airflow.process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and session_pids(pid):
        with contextlib.suppress(subprocess.TimeoutExpired):
            airflow.process.wait(0.2)
    # Task runners sit in process groups of their own (same session): the session catches them too.
    for leftover in session_pids(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        airflow.process.wait(5)


def start_airflow(workdir: Path, sandbox_url: str, extra_env: dict[str, str] | None = None) -> Airflow:
    """What ``airflow standalone`` runs, in one new session (setsid) and process group, bound to 127.0.0.1 only.

    ``airflow standalone`` itself cannot be used here: its scheduler and triggerer start the task log server on
    0.0.0.0 / [::] (``[logging] worker_log_server_port``, no host setting) and it cannot pass ``--skip-serve-logs``.
    So this runs its four components the way it does (LocalExecutor, SimpleAuthManager, after ``db migrate``), with
    ``--skip-serve-logs`` (the logs are local files the API server reads anyway) and the API server on 127.0.0.1.
    ``extra_env`` adds or overrides settings (connections, tuning) for every component.
    """
    home = workdir / "airflow-home"
    home.mkdir(parents=True)
    port = free_port()
    venv_bin = Path(sys.executable).parent
    connection = {"conn_type": "google_cloud_platform", "extra": connection_extra(sandbox_url, "nemo-rl-demo")}
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(port),
        # Tasks reach the Execution API through base_url, whose default is localhost:8080.
        "AIRFLOW__API__BASE_URL": f"http://{HOST}:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{HOST}:{port}/execution/",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(connection),
        # preflight_live checks the job's secrets exist; the bench measures provisioning, so placeholders do.
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": "hf_bench_placeholder"}),
        "AIRFLOW_CONN_WANDB_DEFAULT": json.dumps({"conn_type": "generic", "password": "wandb_bench_placeholder"}),
        **AIRFLOW_TUNING,
        **(extra_env or {}),
    }
    env.pop("PYTHONPATH", None)
    # Each component restarts a second after it exits, as docker-compose.yaml's `restart: unless-stopped` (or a
    # Deployment) restarts it: what the Airflow-restart tests rely on after they kill one (kill_component).
    script = f"""
set -e
airflow db migrate > db-migrate.log 2>&1
supervise() {{ log=$1; shift; while :; do "$@" >> "$log" 2>&1 || true; sleep 1; done; }}
supervise scheduler.log airflow scheduler --skip-serve-logs &
supervise triggerer.log airflow triggerer --skip-serve-logs &
supervise dag-processor.log airflow dag-processor &
supervise api-server.log airflow api-server --host {HOST} --port {port} &
wait
"""
    log_path = workdir / "components.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["/bin/bash", "-c", script],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # setsid: its own session and process group, stopped as one
        )
    return Airflow(process, home, port, workdir)


def wait_ready(airflow: Airflow, timeout: float) -> None:
    """Health of every component, a token, and the DAG parsed and unpaused, all within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout

    def healthy() -> bool:
        if airflow.process.poll() is not None:
            raise AirflowStartError(f"the Airflow components exited with {airflow.process.returncode}")
        status, body = http_json(f"{airflow.url}/api/v2/monitor/health", timeout=5)
        if status != 200 or not isinstance(body, dict):
            return False
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((body.get(p) or {}).get("status") == "healthy" for p in parts)

    wait_for("Airflow health (scheduler, triggerer, dag processor)", healthy, deadline - time.monotonic())
    password_file = airflow.home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(password_file.read_text())["admin"]
    status, body = http_json(f"{airflow.url}/auth/token", "POST", {"username": "admin", "password": password})
    if status not in {200, 201}:
        raise AirflowStartError(f"POST /auth/token -> {status}: {body}")
    airflow.token = body["access_token"]

    def dag_loaded() -> bool:
        errors = airflow.api("GET", "/api/v2/importErrors")
        if errors.get("total_entries"):
            raise AirflowStartError(f"import errors: {json.dumps(errors['import_errors'])[:2000]}")
        status, _ = http_json(f"{airflow.url}/api/v2/dags/{DAG_ID}", token=airflow.token)
        return status == 200

    wait_for(f"DAG {DAG_ID} to be parsed", dag_loaded, max(deadline - time.monotonic(), 1.0))
    airflow.api("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})


def trigger(airflow: Airflow, conf: dict[str, Any], dag_id: str = DAG_ID) -> str:
    """Trigger one run over the REST API; its run id."""
    run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    return str(run["dag_run_id"])


def run_path(run_id: str, dag_id: str = DAG_ID) -> str:
    """The REST path of one run (the run id URL-encoded: it holds ':' and '+')."""
    return f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"


def wait_run(airflow: Airflow, run_id: str, timeout: float, dag_id: str = DAG_ID) -> dict[str, Any]:
    """Wait until the run has ended (success or failed); the run as the API returns it."""

    def finished() -> dict[str, Any] | None:
        current = airflow.api("GET", run_path(run_id, dag_id))
        return current if current["state"] in {"success", "failed"} else None

    return wait_for(f"run {run_id} to finish", finished, timeout, interval=1.0)


def task_instances(airflow: Airflow, run_id: str, dag_id: str = DAG_ID) -> list[dict[str, Any]]:
    """Every task instance of the run."""
    return airflow.api("GET", f"{run_path(run_id, dag_id)}/taskInstances?limit=200")["task_instances"]


def xcom_value(airflow: Airflow, run_id: str, task_id: str, key: str = "return_value", dag_id: str = DAG_ID) -> Any:
    """One XCom of the run's task (its latest try's), as the REST API deserializes it."""
    task = urllib.parse.quote(task_id, safe="")
    return airflow.api("GET", f"{run_path(run_id, dag_id)}/taskInstances/{task}/xcomEntries/{key}")["value"]


@contextlib.contextmanager
def running_airflow(
    workdir: Path, sandbox_url: str, extra_env: dict[str, str] | None = None, start_timeout: float = 180.0
) -> Iterator[Airflow]:
    """Airflow started, ready (healthy, logged in, the DAG parsed and unpaused) and stopped again on exit."""
    airflow = start_airflow(workdir, sandbox_url, extra_env)
    try:
        try:
            wait_ready(airflow, start_timeout)
        except AirflowStartError as exc:
            raise AirflowStartError(f"{exc}\n{airflow.log_tail()}") from exc
        yield airflow
    finally:
        stop_airflow(airflow)


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGINT / SIGTERM / SIGHUP raise KeyboardInterrupt, so the finally blocks clean up for each of them.

    SIGINT is set explicitly too: a process started in the background by a shell inherits it ignored.
    """

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_bench(prefix: str, keep: bool, measure: Callable[[Path, dict[str, Any]], bool]) -> int:
    """Run ``measure(workdir, running)`` in a fresh temp dir and return the exit status: 0 when it passes, 1 when it
    misses, 2 when the bench failed. What it records in ``running`` (``"airflow"``, ``"sandbox"``, ``"postgres"``) is
    stopped and the
    temp dir removed (unless ``keep``) on every way out, Ctrl-C and failure included."""
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    running: dict[str, Any] = {}
    started = time.monotonic()
    try:
        with signals_as_interrupt():
            return 0 if measure(workdir, running) else 1
    except (BenchError, SandboxError, OSError, KeyboardInterrupt) as exc:
        print(f"bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        if "airflow" in running and not isinstance(exc, KeyboardInterrupt):
            print(running["airflow"].log_tail(), file=sys.stderr)
        return 2
    finally:
        # Cleanup must not be cut short by a second Ctrl-C.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if "airflow" in running:
                stop_airflow(running["airflow"])
            if "sandbox" in running:
                running["sandbox"].stop()
            if "postgres" in running:
                running["postgres"].stop()
        finally:
            if keep:
                print(f"kept {workdir}", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
            signal.signal(signal.SIGINT, old_int)
            print(f"bench wall time {time.monotonic() - started:.0f} s", file=sys.stderr)
