"""The Ray job side against a real Ray head on the sandbox (a RayCluster, reached through the API service proxy):
the Ray Jobs hook pair (exactly-once submission, status, logs from an offset, stop, the Ray token and the cluster's
CA), and RayJobTrigger in the Airflow style (serialize, round trip, success / failure / stopped / error events, still
waiting, the zero-learning guard, the timeout, and on_kill stopping the job).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.testing import SandboxProcess
from sandbox.tls import new_cluster_tls

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.kube.access import DashboardAddress
from nemo_rl_gke.kube.client import KubeHook, ObjectRef
from nemo_rl_gke.kube.objects import apply_objects, delete_objects, group_objects, lustre_ip
from nemo_rl_gke.observe.driver_log import FOLLOWING, RESUMED_AT
from nemo_rl_gke.observe.report import RunInputs, build_report
from nemo_rl_gke.plan.ray_job import JobRequest, SecretEnv
from nemo_rl_gke.ray.async_hooks import RayJobsApiError, RayJobsAsyncHook
from nemo_rl_gke.ray.hooks import RayJobsHook, RayTlsError
from nemo_rl_gke.ray.log_tail import QUICK_END_BYTES
from nemo_rl_gke.ray.submit import (
    KUBE_REST_LOGGERS,
    RAY_TOKEN_HEADER,
    SecretMissingError,
    ray_token_source,
    resolve_secrets,
)
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.triggers.operations import LONG_WAIT_CAP_S
from nemo_rl_gke.triggers.rayjob import CLASSPATH, RayJobTrigger
from tests.gcp.conftest import FAST_RETRY, ZONE, ensure_cluster_with_gpu_pool, first_event, raycluster_trigger
from tests.owners import owner_of
from tests.triggers.test_log_position import MemoryPositions

pytestmark = pytest.mark.airflow
RAY_PROJECT = "rayjob-tests"
TOKEN_RECIPE = "local-cpu-gsm8k"
RAY_CONF = {"project": RAY_PROJECT, "region": "us-central1", "zone": ZONE, "recipe": TOKEN_RECIPE}

# A NeMo RL-shaped log: three steps with every reward 0 (the published tutorial run), then a long sleep.
ZERO_REWARD_SCRIPT = (
    "import time\n"
    "for k in range(1, 4):\n"
    "    print(f'========================= Step {k}/10 =========================', flush=True)\n"
    "    print('\\U0001f4ca Training Results:', flush=True)\n"
    "    print('  \\u2022 Loss: 0.0000', flush=True)\n"
    "    print('  \\u2022 Avg Reward: 0.0000', flush=True)\n"
    "    print('  \\u2022 Mean Generation Length: 311.0000', flush=True)\n"
    "    print('\\u23f1\\ufe0f  Timing:', flush=True)\n"
    "    print('  \\u2022 Total step time: 0.30s', flush=True)\n"
    "    time.sleep(0.3)\n"
    "time.sleep(120)\n"
)
# Two NeMo RL-shaped steps with a gate between them: step 2 is printed only once the file argv[1] exists.
GATED_SCRIPT = (
    "import os, sys, time\n"
    "def step(k):\n"
    "    print(f'========================= Step {k}/2 =========================', flush=True)\n"
    "    print('\\U0001f4ca Training Results:', flush=True)\n"
    "    print('  \\u2022 Loss: 0.1000', flush=True)\n"
    "    print(f'  \\u2022 Avg Reward: {0.25 * k:.4f}', flush=True)\n"
    "step(1)\n"
    "deadline = time.time() + 90\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    if time.time() > deadline:\n"
    "        sys.exit('never released: the trigger did not show step 1 while the job ran')\n"
    "    time.sleep(0.05)\n"
    "step(2)\n"
)


@pytest.fixture(scope="module")
def ray_hook(sandbox: SandboxProcess) -> Iterator[GcpHook]:
    """The module's hook on google_cloud_default -> the sandbox (one project for the module's one Ray head)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox.connection_json(RAY_PROJECT))
        yield GcpHook(retry_policy=FAST_RETRY)


@pytest.fixture(scope="module")
def ray_spec(ray_hook: GcpHook) -> Iterator[RunSpec]:
    """A running cluster with Lustre, the PV/PVC and a ready RayCluster: one real Ray head that every test of the
    module submits its own jobs to (distinct submission ids keep them apart)."""
    # The local recipe pins a Ray with token auth: its RayCluster has authOptions {mode: token}, so every request of
    # the module goes through the production path that reads KubeRay's Secret and sends X-Ray-Authorization.
    spec = RunSpec.from_conf(RAY_CONF)
    hook = ray_hook
    ensure_cluster_with_gpu_pool(spec, hook)
    kube = KubeHook(spec, hook)
    objects = [
        *group_objects(spec, t.LUSTRE_STORAGE, owner_of(spec), lustre_address=lustre_ip(spec, hook)),
        *group_objects(spec, t.RAYCLUSTER, owner_of(spec)),
    ]
    apply_objects(kube, objects, owner_of(spec), adopt=False)
    assert asyncio.run(first_event(raycluster_trigger(spec)))["status"] == "success"
    yield spec
    delete_objects(kube, objects, owner_of(spec))


def _request(submission_id: str, entrypoint: str) -> JobRequest:
    return JobRequest(submission_id, entrypoint, {"MODE": "test"}, (), (), {"airflow_dag_id": "t"})


def _ray(spec: RunSpec, hook: GcpHook) -> RayJobsHook:
    """The sync hook as the operators build it: the run's dashboard through the API server, with both tokens."""
    return RayJobsHook.for_run(spec, hook, Deployment())


def _async_hook(address: DashboardAddress, **kwargs: Any) -> RayJobsAsyncHook:
    """The async hook as the trigger builds it from its kwargs: where the Ray token is, never the token."""
    source = ray_token_source(RunSpec.from_conf(RAY_CONF))
    return RayJobsAsyncHook(address.url, needs_token=address.needs_token, ca_pem=address.ca_pem, **{**source, **kwargs})


def _wait_for_status(ray: RayJobsHook, submission_id: str, wanted: str, timeout_s: float = 30.0) -> str | None:
    """The job's status once it is ``wanted``, or whatever it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (status := ray.status(submission_id)) != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def _trigger(address: DashboardAddress, submission_id: str, **kwargs: Any) -> RayJobTrigger:
    """The trigger as the sensor defers to it: where the Ray token is (never the token) comes from the spec."""
    source = ray_token_source(RunSpec.from_conf(RAY_CONF))
    return RayJobTrigger(
        address=address.url,
        submission_id=submission_id,
        needs_token=address.needs_token,
        poll_interval=0.2,
        ca_pem=address.ca_pem,
        **{**source, **kwargs},
    )


def test_submission_is_exactly_once_per_submission_id(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    request = _request("nemo-rl-once-1", "python -c \"import os; print('mode', os.environ['MODE'])\"")
    before = time.time()
    first = ray.submit(request, {})
    _wait_for_status(ray, "nemo-rl-once-1", "SUCCEEDED")
    adopting = time.time()
    second = ray.submit(request, {})
    assert (first.action, second.action) == ("submitted", "adopted")
    # The adopted job keeps its real start (Ray's start_time), so its timeout does not restart at the adoption.
    assert first.started_at is None and second.started_at is not None
    assert before - 1 <= second.started_at < adopting
    jobs = ray.client.list_jobs()
    assert [j.submission_id for j in jobs].count("nemo-rl-once-1") == 1
    event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-once-1")))
    assert event["status"] == "success" and event["job_status"] == "SUCCEEDED"
    assert "mode test" in event["tail"]


def test_ray_jobs_clients_with_another_ca_fail_at_once_and_submit_nothing(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    address = ray.address
    assert address.ca_pem and address.url.startswith("https://127.0.0.1:")
    impostor = DashboardAddress(address.url, address.needs_token, new_cluster_tls("impostor").ca_pem)
    system_cas = DashboardAddress(address.url, address.needs_token)
    request = _request("nemo-rl-wrong-ca-1", "python -c \"print('never')\"")
    with pytest.raises(RayTlsError, match=r"does not verify against the CA in .*certificate verify failed"):
        RayJobsHook(impostor, ray.headers).submit(request, {})
    # The default is the system's CAs, which do not sign a cluster's own CA either: verification is never off.
    with pytest.raises(RayTlsError, match="does not verify against the system's CAs"):
        RayJobsHook(system_cas, ray.headers).submit(request, {})

    # The async hook: the same refusal, on its first request, from every domain method.
    async def refused(address: DashboardAddress) -> list[str]:
        messages = []
        async with _async_hook(address) as hook:
            await hook.read_ray_token()  # through the API server's own TLS (the GKE cluster's CA, from Google)
            for call in (hook.status, hook.stop, lambda job: hook.logs(job, 0)):
                with pytest.raises(RayTlsError) as error:
                    await call("nemo-rl-wrong-ca-1")
                messages.append(str(error.value))
        return messages

    assert all("against the cluster's CA" in m and "verify failed" in m for m in asyncio.run(refused(impostor)))
    assert all("against the system's CAs" in m for m in asyncio.run(refused(system_cas)))
    # The trigger's aiohttp client ends in an error event at once, not after its timeout as if it were transient.
    event = asyncio.run(first_event(_trigger(impostor, "nemo-rl-wrong-ca-1", timeout=600)))
    assert event["status"] == "error", event
    assert "does not verify against the cluster's CA" in event["message"] and "verify failed" in event["message"]
    jobs = ray.client.list_jobs()
    assert "nemo-rl-wrong-ca-1" not in [j.submission_id for j in jobs]


# Prints two lines, waits for the file argv[1], prints a third, then runs until it is stopped. The lines are joined
# when printed: Ray's log starts with the entrypoint, which must not hold them.
HOOK_SCRIPT = (
    "import os, sys, time\n"
    "print('first' + ' line', flush=True)\n"
    "print('second' + ' line', flush=True)\n"
    "deadline = time.time() + 90\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('third' + ' line', flush=True)\n"
    "time.sleep(120)\n"
)


async def _read_until(hook: RayJobsAsyncHook, job: str, offset: int, marker: str) -> str:
    """The log from ``offset`` on, read by the hook until it holds ``marker`` (a stream sends it as it comes)."""
    text, deadline = "", time.monotonic() + 60
    while marker not in text:
        assert time.monotonic() < deadline, f"{marker!r} never came: {text!r}"
        read = await hook.logs(job, offset + len(text))
        assert read.start == offset + len(text) and read.fallback == "", read
        text += read.text or ""
        await asyncio.sleep(0.05)
    return text


def test_the_hooks_read_status_and_logs_from_an_offset_and_stop_the_job(
    ray_spec: RunSpec, ray_hook: GcpHook, tmp_path: Any
) -> None:
    ray = _ray(ray_spec, ray_hook)
    job, gate = "nemo-rl-hooks-1", tmp_path / "gate"
    assert ray.status(job) is None
    ray.submit(_request(job, f"python -c {_quoted(HOOK_SCRIPT)} {_quoted(str(gate))}"), {})
    assert _wait_for_status(ray, job, "RUNNING") == "RUNNING"
    deadline = time.monotonic() + 60
    while "second line" not in (full := ray.logs(job)):
        assert time.monotonic() < deadline, full
        time.sleep(0.1)
    offset = full.index("second line")
    assert ray.logs(job, offset) == full[offset:] == "second line\n"

    async def follow() -> tuple[str, str, str]:
        token = ray.headers[RAY_TOKEN_HEADER].removeprefix("Bearer ")
        async with _async_hook(ray.address, log_stream=False) as whole, _async_hook(ray.address) as streamed:
            # Ray refuses a request without its token: the hook sends the one it read, and only once it read it.
            with pytest.raises(RayJobsApiError, match="HTTP 401") as refused:
                await whole.status(job)
            assert refused.value.status == 401
            assert await whole.read_ray_token() == await streamed.read_ray_token() == token
            info = await whole.status(job)
            assert info is not None and info["status"] == "RUNNING" and info["submission_id"] == job
            assert await whole.status("nemo-rl-no-such-job") is None
            downloaded = await whole.logs(job, offset)
            assert (downloaded.text, downloaded.start) == (full[offset:], offset)
            before = await _read_until(streamed, job, offset, "second line")
            gate.touch()
            after = await _read_until(streamed, job, offset + len(before), "third line")
            # The async stop of a running job is the trigger's (the guard, the timeout, on_kill tests).
            with pytest.raises(RayJobsApiError, match="HTTP 404"):
                await streamed.stop("nemo-rl-no-such-job")
            return before, after, (await whole.logs(job, 0)).text or ""

    before, after, whole_log = asyncio.run(follow())
    assert before == "second line\n" and after == "third line\n"  # from the offset on, each byte once
    assert whole_log.endswith("first line\nsecond line\nthird line\n")
    assert ray.stop(job) is True
    assert _wait_for_status(ray, job, "STOPPED") == "STOPPED"
    with pytest.raises(RuntimeError, match="does not exist"):
        ray.stop("nemo-rl-no-such-job")


class _Records(logging.Handler):
    """Keeps every record of the loggers it is attached to, whatever the root logger's handlers become."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_ray_token_never_reaches_a_log_record_an_event_or_the_trigger_kwargs(
    ray_spec: RunSpec, ray_hook: GcpHook, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    # The kubernetes clients log each response body at DEBUG, the Secret's the Ray token is read from included.
    kept = _Records()
    for name in KUBE_REST_LOGGERS:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "level", logging.DEBUG)
        monkeypatch.setattr(logger, "handlers", [*logger.handlers, kept])
    ray = _ray(ray_spec, ray_hook)
    token = ray.headers[RAY_TOKEN_HEADER].removeprefix("Bearer ")
    ray.submit(_request("nemo-rl-quiet-1", "python -c \"print('quiet')\""), {})
    trigger = _trigger(ray.address, "nemo-rl-quiet-1")
    recorder = _Recorder()
    trigger._log = recorder
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success" and "quiet" in ray.logs("nemo-rl-quiet-1")
    # Control: what the hook logs (structlog, on stdout), the trigger's lines and kubernetes' body records were seen.
    out, err = capfd.readouterr()
    assert "Submitted Ray job nemo-rl-quiet-1" in out + err
    assert "[ray job] quiet" in recorder.lines
    KubeHook(ray_spec, ray_hook).get(ObjectRef("ray.io/v1", "RayCluster", ray_spec.raycluster_name, ray_spec.namespace))
    bodies = [r.getMessage() for r in kept.records if r.getMessage().startswith("response body")]
    assert any('"kind": "RayCluster"' in body for body in bodies), bodies
    written = [out, err, *bodies, *recorder.lines, json.dumps(event), json.dumps(trigger.serialize()[1])]
    forms = {token, base64.b64encode(token.encode()).decode()}  # base64 (a Secret's data) masks nothing
    assert [text for text in written for form in forms if form in text] == []


class _GateOpener:
    """Stands in for the trigger's logger: records what it logs and opens the job's gate once step 1 shows."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate
        self.lines: list[str] = []
        self.opened_after: int | None = None

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(message % args if args else message)
        if self.opened_after is None and "Step 1/2" in self.lines[-1]:
            self.opened_after = len(self.lines)
            self.gate.touch()

    warning = debug = exception = error = info


def test_step_lines_reach_the_task_log_while_the_job_runs(ray_spec: RunSpec, ray_hook: GcpHook, tmp_path: Any) -> None:
    # Causal, not timed: the job cannot print step 2 (or end) until the trigger has logged step 1.
    ray = _ray(ray_spec, ray_hook)
    gate = tmp_path / "step-1-was-shown"
    entrypoint = f"python -c {_quoted(GATED_SCRIPT)} {_quoted(str(gate))}"
    ray.submit(_request("nemo-rl-live-1", entrypoint), {})
    trigger = _trigger(ray.address, "nemo-rl-live-1")
    opener = _GateOpener(gate)
    trigger._log = opener
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success", event
    assert opener.opened_after is not None, opener.lines
    shown_later = opener.lines[opener.opened_after :]
    assert any("Step 2/2" in line for line in shown_later), opener.lines
    summary = event["summary"]
    assert (summary["steps_completed"], summary["first_reward"], summary["last_reward"]) == (2, 0.25, 0.5)


def test_a_job_days_old_is_followed_through_its_stream_and_its_status_asked_only_at_the_ends(
    ray_spec: RunSpec, ray_hook: GcpHook, tmp_path: Any
) -> None:
    # Three days into a long job the status poll has backed off to LONG_WAIT_CAP_S, but the log still arrives as it
    # comes (step 2 waits for the trigger to show step 1) and the stream's end brings the status at once.
    ray = _ray(ray_spec, ray_hook)
    gate = tmp_path / "step-1-was-shown"
    ray.submit(_request("nemo-rl-days-1", f"python -c {_quoted(GATED_SCRIPT)} {_quoted(str(gate))}"), {})
    days_ago = time.time() - 3 * 24 * 3600
    trigger = _trigger(
        ray.address, "nemo-rl-days-1", started_at=days_ago, timeout=30 * 24 * 3600.0, stall_after_s=4 * 24 * 3600.0
    )
    assert trigger._poll_delay(time.time()) == LONG_WAIT_CAP_S
    opener = _GateOpener(gate)
    trigger._log = opener
    asked: list[str] = []

    async def follow() -> dict[str, Any]:
        hook = await trigger._ray_hook()
        status = hook.status

        async def counted(submission_id: str) -> dict[str, Any] | None:
            found = await status(submission_id)
            asked.append(str((found or {}).get("status")))
            return found

        hook.status = counted  # type: ignore[method-assign]
        # Bounded: a trigger that slept through LONG_WAIT_CAP_S would fail here, not hang the suite.
        return await asyncio.wait_for(first_event(trigger), 120)

    event = asyncio.run(follow())
    assert event["status"] == "success", event
    assert opener.opened_after is not None, opener.lines
    assert any("Step 2/2" in line for line in opener.lines[opener.opened_after :]), opener.lines
    # Asked when it began, then after Ray closed the stream (once more if Ray had not yet called the job done).
    assert asked[0] in ("PENDING", "RUNNING") and asked[-1] == "SUCCEEDED" and len(asked) <= 3, asked


def test_a_failing_job_reports_ray_message_exit_code_and_last_lines(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    script = "import sys; print('loading the model'); print('CUDA out of memory', file=sys.stderr); sys.exit(3)"
    ray.submit(_request("nemo-rl-fail-1", f'python -c "{script}"'), {})
    event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-fail-1")))
    assert event["status"] == "failed" and event["job_status"] == "FAILED"
    assert "error type: JOB_ENTRYPOINT_COMMAND_ERROR" in event["message"]
    assert "driver exit code: 3" in event["message"]
    assert "CUDA out of memory" in event["tail"]


def test_zero_learning_guard_stops_the_job_within_k_steps(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-zero-1", f"python -c {_quoted(ZERO_REWARD_SCRIPT)}"), {})
    event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-zero-1", zero_learning_steps=3)))
    assert event["status"] == "zero_learning", event
    assert "GRPO" in event["message"] and "zero_learning_guard" in event["message"]
    assert event["message"].endswith("Ray job nemo-rl-zero-1: the job was stopped.")
    assert event["guard"] == {"kind": "never_learned", "decided_at": "3/10", "k": 3}
    assert event["summary"]["steps_completed"] >= 3 and event["summary"]["best_reward"] == 0.0
    assert _wait_for_status(ray, "nemo-rl-zero-1", "STOPPED") == "STOPPED"


# Learns (0.3), converges (1.0 from step 2), saves at step 4, starts step 5, then would run on for two minutes.
CONVERGING_SCRIPT = (
    "import time\n"
    "for k, reward in enumerate([0.3, 1.0, 1.0, 1.0, 1.0], 1):\n"
    "    print(f'========================= Step {k}/50 =========================', flush=True)\n"
    "    print('\\U0001f4ca Training Results:', flush=True)\n"
    "    print('  \\u2022 Loss: 0.0100', flush=True)\n"
    "    print(f'  \\u2022 Avg Reward: {reward:.4f}', flush=True)\n"
    "    if k == 4:\n"
    "        print('Saving checkpoint for step 4...', flush=True)\n"
    "    time.sleep(0.3)\n"
    "time.sleep(120)\n"
)


def test_a_converged_job_runs_to_its_next_save_and_is_stopped_as_a_success(
    ray_spec: RunSpec, ray_hook: GcpHook
) -> None:
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-converge-1", f"python -c {_quoted(CONVERGING_SCRIPT)}"), {})
    recorder = _Recorder()
    # The trigger as the triggerer loads it: serialized (the kwargs test_trigger_serializes_exactly_and_round_trips
    # pins), through JSON as Airflow stores it, and built again; its stop rules then decide (decide/job_stop.py).
    classpath, kwargs = _trigger(ray.address, "nemo-rl-converge-1", zero_learning_steps=2).serialize()
    assert classpath == CLASSPATH
    trigger = RayJobTrigger(**json.loads(json.dumps(kwargs)))
    trigger._log = recorder
    started = time.monotonic()
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "converged", event
    assert time.monotonic() - started < 60  # stopped after the save, not at the end of the two minutes
    # Decided at step 3 (two uniform steps after one that learned); stopped once step 5 began: step 4's save is done.
    assert event["guard"] == {"kind": "converged", "decided_at": "3/50", "k": 2}
    assert event["final_step"] == 4
    assert "Converged at step 3/50; checkpoint step 4 is saved" in event["message"]
    assert sum("converged at step 3/50" in line for line in recorder.lines) == 1, recorder.lines
    assert _wait_for_status(ray, "nemo-rl-converge-1", "STOPPED") == "STOPPED"


def test_still_waiting_then_on_kill_stops_the_job_and_timeout_stops_it_too(
    ray_spec: RunSpec, ray_hook: GcpHook
) -> None:
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-kill-1", 'python -c "import time; time.sleep(120)"'), {})
    trigger = _trigger(ray.address, "nemo-rl-kill-1")
    # Still waiting: a running job yields nothing within a short window.
    with pytest.raises(TimeoutError):
        asyncio.run(first_event(trigger, timeout=3))
    asyncio.run(trigger.on_kill())
    assert _wait_for_status(ray, "nemo-rl-kill-1", "STOPPED") == "STOPPED"
    assert asyncio.run(first_event(_trigger(ray.address, "nemo-rl-kill-1")))["status"] == "stopped"

    ray.submit(_request("nemo-rl-late-1", 'python -c "import time; time.sleep(120)"'), {})
    event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-late-1", timeout=2)))
    assert event["status"] == "timeout" and "the job was stopped" in event["message"]


def test_a_job_that_prints_its_secret_shows_it_masked(
    ray_spec: RunSpec, ray_hook: GcpHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_PRINTEDsecret0123456789"
    monkeypatch.setenv("AIRFLOW_CONN_HF_PRINTED", f'{{"conn_type": "generic", "password": "{secret}"}}')
    ray = _ray(ray_spec, ray_hook)
    request = JobRequest(
        "nemo-rl-print-1", "python -c \"import os; print('token is', os.environ['HF_TOKEN'])\"", {}, (), ()
    )
    ray.submit(request, {"HF_TOKEN": secret})
    event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-print-1", secret_conn_ids=["hf_printed"])))
    assert event["status"] == "success"
    assert "token is ***" in event["tail"]
    assert secret not in json.dumps(event)


def test_trigger_error_events(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    missing = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-no-such-job")))
    assert missing["status"] == "error" and "does not exist" in missing["message"]


def test_trigger_serializes_exactly_and_round_trips() -> None:
    trigger = RayJobTrigger(
        address="http://h/api/v1/namespaces/default/services/rc-head-svc:8265/proxy/",
        submission_id="nemo-rl-x",
        needs_token=True,
        gcp_conn_id="gcp",
        poll_interval=5,
        timeout=100,
        started_at=1.0,
        zero_learning_steps=3,
        secret_conn_ids=["huggingface_default"],
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert kwargs == {
        "address": "http://h/api/v1/namespaces/default/services/rc-head-svc:8265/proxy",
        "submission_id": "nemo-rl-x",
        "needs_token": True,
        "gcp_conn_id": "gcp",
        "poll_interval": 5.0,
        "timeout": 100.0,
        "started_at": 1.0,
        "zero_learning_steps": 3,
        "secret_conn_ids": ["huggingface_default"],
        "ca_pem": "",
        "cluster_path": "",
        "ray_token_secret": "",
        "log_stream": True,
        "budget_deadline": 0.0,
        "run_started_at": 1.0,
        "usd_per_hour": 0.0,
        "max_steps": 0,
        "stall_after_s": 0.0,
        "attempt_started_at": 0.0,
        "task_key": None,
        "clock": None,
    }
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)
    budgeted = RayJobTrigger(
        address="https://h",
        submission_id="nemo-rl-y",
        started_at=5.0,
        budget_deadline=100.0,
        run_started_at=2.0,
        usd_per_hour=88.0,
        max_steps=20,
        stall_after_s=30,
        task_key={"dag_id": "d", "run_id": "manual__1", "task_id": "train.wait", "map_index": -1},
    )
    _, kwargs = budgeted.serialize()
    assert kwargs["task_key"] == {"dag_id": "d", "run_id": "manual__1", "task_id": "train.wait", "map_index": -1}
    assert {
        k: kwargs[k] for k in ("budget_deadline", "run_started_at", "usd_per_hour", "max_steps", "stall_after_s")
    } == {
        "budget_deadline": 100.0,
        "run_started_at": 2.0,
        "usd_per_hour": 88.0,
        "max_steps": 20,
        "stall_after_s": 30.0,
    }
    assert RayJobTrigger(**kwargs).serialize() == budgeted.serialize()
    # A trigger serialized before the run's clock (no "clock" kwarg) still loads: its budget deadline is its one
    # limit, with no overrun, priced as before.
    legacy = {k: v for k, v in kwargs.items() if k != "clock"}
    old = RayJobTrigger(**legacy)
    assert old.clock.deadline is not None and old.clock.deadline.at == 100.0 and old.clock.overrun_s == 0
    assert old.clock.usd_at(3602.0) == pytest.approx(88.0) and old.clock.stop_at(None) == 100.0
    # The clock round-trips through the trigger's kwargs (a triggerer restart keeps it).
    clock = _clock(60, 30, 120)
    clocked = RayJobTrigger(address="https://h", submission_id="nemo-rl-z", started_at=5.0, clock=clock)
    _, kwargs = clocked.serialize()
    assert kwargs["clock"] == clock and RayJobTrigger(**kwargs).serialize() == clocked.serialize()
    assert RayJobTrigger(**kwargs).clock.overrun_s == 120 and RayJobTrigger(**kwargs).clock.job_save_by_s == 30


def _get(url: str, headers: dict[str, str], ca_pem: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=ssl.create_default_context(cadata=ca_pem)) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_ray_itself_refuses_a_jobs_request_without_its_token(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    ray = _ray(ray_spec, ray_hook)
    address, headers = ray.address, ray.headers
    token = headers[RAY_TOKEN_HEADER].removeprefix("Bearer ")
    assert len(token) >= 32
    others = {k: v for k, v in headers.items() if k != RAY_TOKEN_HEADER}
    # Through the service proxy (which passes X-Ray-Authorization on): Ray's own middleware answers.
    assert _get(f"{address.url}/api/jobs/", others, address.ca_pem) == (
        401,
        "Unauthorized: Missing authentication token",
    )
    wrong = {**others, RAY_TOKEN_HEADER: "Bearer " + "x" * len(token)}
    assert _get(f"{address.url}/api/jobs/", wrong, address.ca_pem) == (403, "Forbidden: Invalid authentication token")
    assert _get(f"{address.url}/api/jobs/", headers, address.ca_pem)[0] == 200
    # The token is named by where it is, never by its value, in what the trigger stores in the metadata DB.
    kwargs = _trigger(ray.address, "nemo-rl-any").serialize()[1]
    assert kwargs["ray_token_secret"].endswith(f"/secrets/{ray_spec.raycluster_name}")
    assert token not in json.dumps(kwargs)


# Sockets of the sandbox's Ray that may listen beyond loopback because Ray gives no choice: none, with
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (sandbox/kuberay.py). Kept as a named, empty allowance so a Ray upgrade that
# adds one fails here and must be argued for.
NO_CHOICE: frozenset[str] = frozenset()


def test_the_sandbox_ray_listens_on_loopback_only(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess, tmp_path: Any
) -> None:
    import ipaddress
    import os

    import psutil

    ray = _ray(ray_spec, ray_hook)
    # A job running keeps its workers (and their ports) alive while the sockets are listed.
    release = str(tmp_path / "release")
    script = f"import os, time\nwhile not os.path.exists({release!r}): time.sleep(0.1)\n"
    ray.submit(_request("nemo-rl-loopback-1", f"python -c {_quoted(script)}"), {})
    try:
        _wait_for_status(ray, "nemo-rl-loopback-1", "RUNNING", timeout_s=60)
        heads = [h for h in sandbox.full_inventory()["ray_heads"] if h["raycluster"] == ray_spec.raycluster_name]
        group = os.getpgid(heads[0]["pid"])
        listening: list[tuple[str, str, int]] = []
        for process in psutil.process_iter(["name"]):
            try:
                if os.getpgid(process.pid) != group:
                    continue
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        listening.append((process.info["name"], conn.laddr.ip, conn.laddr.port))
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue
    finally:
        open(release, "w").close()
    assert len(listening) >= 5, listening  # GCS, raylet, dashboard, agent, client server at least
    beyond = []
    for name, ip, port in listening:
        host = ipaddress.ip_address(ip)
        mapped = host.ipv4_mapped if isinstance(host, ipaddress.IPv6Address) else None
        if not (mapped or host).is_loopback and name not in NO_CHOICE:
            beyond.append((name, ip, port))
    assert beyond == [], beyond


def test_secrets_resolve_from_connections_or_fail_naming_the_connection() -> None:
    request = JobRequest("s", "true", {}, (SecretEnv("HF_TOKEN", "hf_conn"),), ())
    deployment = Deployment(hf_conn_ids=("hf_conn",))
    assert resolve_secrets(request, {"hf_conn": "tok"}.get, deployment) == {"HF_TOKEN": "tok"}
    with pytest.raises(SecretMissingError, match="Airflow connection 'hf_conn'"):
        resolve_secrets(request, {}.get, deployment)


def _quoted(script: str) -> str:
    import shlex

    return shlex.quote(script)


# A job that prints its token in pieces: across two prints a second apart (so, most likely, two polls), split by "\r",
# cut by the display limit, percent-encoded inside a W&B link, and split over two lines of a Ray task (each line gets
# the task's actor prefix in the driver log).
SPLIT_SECRET_SCRIPT = (
    "import os, sys, time\n"
    "import ray\n"
    "t = os.environ['HF_TOKEN']\n"
    "print('token is', t[:10], flush=True)\n"
    "time.sleep(1)\n"
    "print(t[10:], 'end', flush=True)\n"
    "sys.stdout.write('bar ' + t[:5] + '\\r' + t[5:] + ' done\\n')\n"
    "print('x' * 1990 + t, flush=True)\n"
    "print('wandb: View run at https://wandb.ai/e/p/runs/x?k=' + t.replace('_', '%5F'), flush=True)\n"
    "@ray.remote\n"
    "def show(token):\n"
    "    print('task has', token[:12])\n"
    "    print(token[12:], 'task end')\n"
    "ray.get(show.remote(t))\n"
    "time.sleep(2)\n"
)


class _Recorder:
    """Stands in for the trigger's logger and keeps every line it logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(message % args if args else message)

    warning = debug = exception = error = info


def test_a_job_that_prints_its_secret_in_pieces_shows_none_of_it(
    ray_spec: RunSpec, ray_hook: GcpHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_SPLITsecret0123456789abcd"
    monkeypatch.setenv("AIRFLOW_CONN_HF_SPLIT", json.dumps({"conn_type": "generic", "password": secret}))
    ray = _ray(ray_spec, ray_hook)
    request = JobRequest("nemo-rl-split-1", f"python -c {_quoted(SPLIT_SECRET_SCRIPT)}", {}, (), ())
    ray.submit(request, {"HF_TOKEN": secret})
    trigger = _trigger(ray.address, "nemo-rl-split-1", secret_conn_ids=["hf_split"])
    recorder = _Recorder()
    trigger._log = recorder
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success", event
    written = "\n".join(recorder.lines) + json.dumps(event, ensure_ascii=False)
    pieces = {secret[i : i + 8] for i in range(len(secret) - 7)}
    assert sorted(p for p in pieces if p in written) == [], recorder.lines
    assert "[ray job] token is ***" in recorder.lines
    assert "[ray job] *** end" in recorder.lines
    assert "[ray job] x" + "x" * 1989 + "***" in recorder.lines
    assert event["summary"]["wandb_url"] == "https://wandb.ai/e/p/runs/x?k=***"
    task_lines = [line for line in recorder.lines if "pid=" in line and "task" in line]
    assert any(line.endswith("task has ***") for line in task_lines), recorder.lines
    assert any(line.endswith("*** task end") for line in task_lines), recorder.lines


# A log that grows over many polls: 80 lines of ~5,000 characters, one every 50 ms, then 3 s of quiet in which Ray's
# stream (it sleeps 1 s at each end of file) catches up. 400 kB, past QUICK_END_BYTES: the stream is read to its end.
GROWING_SCRIPT = (
    "import time\nfor k in range(80):\n    print(f'line {k:04d} ' + 'x' * 5000, flush=True)\n    time.sleep(0.05)\n"
    "time.sleep(3)\n"
)


def test_the_log_follower_fetches_only_what_is_new(ray_spec: RunSpec, ray_hook: GcpHook) -> None:
    # Through the service proxy (a websocket upgrade, with the Ray token), side by side with whole-log polls.
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-grow-1", f"python -c {_quoted(GROWING_SCRIPT)}"), {})
    streamed, whole = _trigger(ray.address, "nemo-rl-grow-1"), _trigger(ray.address, "nemo-rl-grow-1", log_stream=False)
    streamed._log, whole._log = _Recorder(), _Recorder()

    async def both() -> list[dict[str, Any]]:
        return list(await asyncio.gather(first_event(streamed), first_event(whole)))

    events = asyncio.run(both())
    assert [e["status"] for e in events] == ["success", "success"], events
    final = len(ray.logs("nemo-rl-grow-1").encode())
    shown = [[line for line in t._log.lines if line.startswith("[ray job]")] for t in (streamed, whole)]
    assert shown[0] == shown[1]  # the same lines, each once
    assert sum(line.startswith("[ray job] line 0") for line in shown[0]) == 80
    assert not any("whole downloads" in line for line in streamed._log.lines), streamed._log.lines
    print(f"fetched/size: stream {streamed.bytes_fetched / final:.2f}, whole logs {whole.bytes_fetched / final:.2f}")
    assert streamed.bytes_fetched / final <= 1.2
    assert whole.bytes_fetched / final > 2  # every poll downloaded everything so far


def test_a_short_log_is_completed_by_one_download_instead_of_waiting_for_rays_close(
    ray_spec: RunSpec, ray_hook: GcpHook
) -> None:
    # A checkpoint validator's log: a few kB. Ray closes the stream seconds after the job ended; one GET is quicker.
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-short-1", "python -c \"print('short and done')\""), {})
    trigger = _trigger(ray.address, "nemo-rl-short-1")
    trigger._log = _Recorder()
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success", event
    assert trigger._log.lines.count("[ray job] short and done") == 1, trigger._log.lines
    final = len(ray.logs("nemo-rl-short-1").encode())
    assert final < QUICK_END_BYTES
    # What the stream had while the job ran, then the whole log once: each line still shown once.
    assert final < trigger.bytes_fetched <= 2 * final, (trigger.bytes_fetched, final)


def test_the_trigger_reads_the_ray_token_again_after_a_transient_error(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-token-retry-1", "python -c \"print('hello')\""), {})
    sandbox.add_fault({"method": "GET", "path": f"/secrets/{ray_spec.raycluster_name}$"}, status=503, times=2)
    try:
        event = asyncio.run(first_event(_trigger(ray.address, "nemo-rl-token-retry-1")))
    finally:
        sandbox.clear_faults()
    assert event["status"] == "success", event
    assert "hello" in event["tail"]


# --- the run's budget and the stall rule, with the real local trainer -------------------------------------------------


def _local_job(
    ray_spec: RunSpec,
    ray_hook: GcpHook,
    submission_id: str,
    overrides: list[str],
    must_save_by: str | None = None,
    max_steps: int = 20,
) -> tuple[Any, Any, RunSpec]:
    """Submit the local GRPO trainer as the DAG does (the recipe's command, its working_dir), with its own
    checkpoint_dir so the tests' jobs never resume from each other's steps; returns (address, headers, spec)."""
    import dataclasses

    from nemo_rl_gke.plan.ray_job import job_request
    from nemo_rl_gke.run.recipes import load_recipe

    conf = {**RAY_CONF, "checkpoint_dir": f"/data/{submission_id}", "extra_overrides": overrides}
    conf.update(worker_replicas=1, gpu_pool_max_nodes=1, colocated=True, dtensor_tp=1, vllm_tp=1, max_steps=max_steps)
    conf.update(num_prompts_per_step=8, num_generations_per_prompt=8, wandb_enabled=False)
    spec = RunSpec.from_conf(conf)
    request = job_request(spec, load_recipe(spec.recipe), "t", "manual__budget", must_save_by=must_save_by)
    request = dataclasses.replace(request, submission_id=submission_id, secrets=())
    ray = _ray(ray_spec, ray_hook)
    ray.submit(request, {})
    return ray.address, ray.headers, spec


def _steps_on_disk(sandbox: SandboxProcess, spec: RunSpec, name: str) -> list[str]:
    from pathlib import Path

    lustre = next(r for r in sandbox.inventory() if r["path"] == spec.lustre_path)
    found = Path(lustre["data_dir"]) / name
    return sorted(p.name for p in found.iterdir()) if found.is_dir() else []


class _Clocked(_Recorder):
    """A recorder that also notes when each line was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        super().info(message, *args, **kwargs)
        self.times.append(time.time())

    warning = debug = exception = error = info


def test_a_job_at_nemo_rls_checkpoint_must_save_by_saves_exits_and_ends_stopped_at_budget(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    # The budget left at submit becomes NeMo RL's deadline: the trainer saves at the step the deadline falls in and
    # exits by itself; the trigger reads that as a budget stop with that step's checkpoint.
    sid = "nemo-rl-budget-own"
    # The local trainer's steps take well under a second here: 1,000 of them outlast a 2 s deadline. No periodic
    # save comes before it (a fast machine trains over 100 steps in 2 s): the deadline's save is the only one.
    overrides = ["checkpointing.save_period=1000"]
    address, _, spec = _local_job(ray_spec, ray_hook, sid, overrides, must_save_by="00:00:00:02", max_steps=1000)
    # The converged guard is off: on a fast machine the local trainer can converge before the deadline falls.
    trigger = _trigger(
        address, sid, max_steps=1000, usd_per_hour=88.0, run_started_at=time.time() - 3600, zero_learning_steps=0
    )
    event = asyncio.run(first_event(trigger, timeout=240))
    assert event["status"] == "budget", event
    steps = event["summary"]["steps_completed"]
    assert 1 <= steps < 1000 and event["final_step"] == steps
    assert event["message"].startswith(f"stopped at budget: {steps} of 1000 steps, ")
    assert "USD" in event["message"] and "checkpoint_must_save_by" in event["message"]
    assert _steps_on_disk(sandbox, spec, sid) == [f"step_{steps}"]
    print(f"\nbudget via checkpoint_must_save_by: {steps} steps trained, step {steps} saved: 0 steps lost")
    print(event["message"])


def test_the_trigger_stops_a_job_without_a_deadline_at_its_next_save_once_the_budget_is_near(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    # As for a NeMo RL without checkpoint_must_save_by: less than a step and the margin left, so the trigger waits
    # for the next save to finish and stops the job then.
    sid = "nemo-rl-budget-stop"
    address, headers, spec = _local_job(ray_spec, ray_hook, sid, ["checkpointing.save_period=3"], max_steps=1000)
    trigger = _trigger(address, sid, max_steps=1000, usd_per_hour=88.0, budget_deadline=time.time() + 75)
    event = asyncio.run(first_event(trigger, timeout=240))
    assert event["status"] == "budget", event
    saved = event["final_step"]
    assert saved is not None and saved % 3 == 0
    assert (
        event["message"].startswith("stopped at budget: ") and f"checkpoint step {saved} is saved" in event["message"]
    )
    assert "the job was stopped" in event["message"]
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address.url, headers=headers, verify=address.verify())
    deadline = time.monotonic() + 30
    while client.get_job_status(sid).value != "STOPPED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_job_status(sid).value == "STOPPED"
    assert f"step_{saved}" in _steps_on_disk(sandbox, spec, sid)
    lost = event["summary"]["steps_completed"] - saved
    print(f"\nbudget stop by the trigger: {event['summary']['steps_completed']} steps, step {saved} saved: {lost} lost")
    print(event["message"])


# How long after the job's own deadline save the trigger may stop it. The save's line reaches the trigger through
# Ray's log tail, which sends new lines about once a second (later on a loaded machine): with 1 s, a full suite once
# saw the stop come before the save's line did, and nothing was counted as saved.
SAVE_SEEN_S = 10.0


def _clock(deadline_in_s: float, save_by_s: int, overrun_s: float) -> dict[str, Any]:
    """A run clock whose one soft limit falls ``deadline_in_s`` from now, the job given ``save_by_s``."""
    from nemo_rl_gke.run.deadline import HOURS, Limit, RunClock

    limit = Limit(HOURS, time.time() + deadline_in_s, False, "the test's budget")
    clock = RunClock((limit,), overrun_s=overrun_s, usd_per_hour=88.0, usd_since=time.time(), gpus=8)
    return clock.with_job(save_by_s, SAVE_SEEN_S).to_dict()


def test_a_slow_setup_past_the_deadline_is_waited_for_within_the_overrun_and_the_jobs_own_save_ends_the_run(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    # NeMo RL starts checkpoint_must_save_by's clock after its setup. A setup (model load) of 8 s more than the
    # deadline's 3 s puts the job's own deadline save after the deadline: the trigger sees SETUP COMPLETE, waits
    # within the deployment's overrun, and the job saves and exits by itself. Stopped at the deadline (the trigger
    # before the clock), it would have lost everything: no step had even started.
    sid = "nemo-rl-slow-setup-overrun"
    overrides = ["checkpointing.save_period=1000", "sandbox.setup_delay_s=8"]
    address, _, spec = _local_job(ray_spec, ray_hook, sid, overrides, must_save_by="00:00:00:04", max_steps=1000)
    trigger = _trigger(address, sid, max_steps=1000, zero_learning_steps=0, clock=_clock(3, 4, 300))
    recorder = _Recorder()
    trigger._log = recorder
    event = asyncio.run(first_event(trigger, timeout=240))
    assert event["status"] == "budget", event
    saved, stop = event["final_step"], event["stop"]
    assert saved is not None and saved == event["summary"]["steps_completed"] >= 1, event
    # The job's deadline save came after the deadline, within the overrun: it ended the run (by itself, or stopped
    # by the trigger right after it), and nothing was lost.
    assert stop["limit"] == "max_run_hours" and stop["overrun_s"] > 0 and stop["lost"] is None, stop
    assert event["message"].startswith(f"stopped at budget (max_run_hours): {saved} of 1000 steps, ")
    assert any("waiting up to" in line and "budget_overrun_minutes" in line for line in recorder.lines)
    # The setup took the delay and more, as the trigger saw it from the submit.
    assert event["startup_s"] >= 8 and stop["setup_done_at"] is not None
    assert _steps_on_disk(sandbox, spec, sid) == [f"step_{saved}"]
    # The run report's lines for this stop, from the trigger's own record of it.
    summary = {**event["summary"], "stopped_at_budget": True, "max_steps": 1000, "final_step": saved,
               "deadline_stop": stop}  # fmt: skip
    inputs = RunInputs(gpu_type="b200", gpus_per_node=8, worker_replicas=1, now=time.time(), training_summary=summary)
    text = build_report([], {}, inputs).to_text()
    assert f"stopped at budget (max_run_hours): {saved} of 1000 steps, " in text
    assert f"ran {stop['overrun_s']:.0f}s past the test's budget to finish its deadline save" in text
    print(f"\nslow setup, overrun: startup {event['startup_s']} s, {stop['overrun_s']:.1f} s past the deadline, "
          f"step {saved} saved: 0 steps lost")  # fmt: skip


def test_a_stop_before_any_save_says_what_it_lost_and_why(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    # No overrun allowed: the deadline falls while NeMo RL still sets up, and nothing can be saved before it. The
    # stop is loud: what was lost, in steps and GPU-hours, and why.
    sid = "nemo-rl-slow-setup-lost"
    overrides = ["checkpointing.save_period=1000", "sandbox.setup_delay_s=30"]
    address, _, spec = _local_job(ray_spec, ray_hook, sid, overrides, must_save_by="00:00:01:00", max_steps=1000)
    trigger = _trigger(address, sid, max_steps=1000, zero_learning_steps=0, clock=_clock(2, 60, 0))
    event = asyncio.run(first_event(trigger, timeout=240))
    assert event["status"] == "budget" and event["final_step"] is None, event
    lost = event["stop"]["lost"]
    assert lost["steps"] == 0 and lost["gpu_hours"] > 0, lost
    assert "budget_overrun_minutes=0" in lost["why"], lost
    assert "GPU-hours were lost" in event["message"] and "newest saved step None" in event["message"]
    assert _steps_on_disk(sandbox, spec, sid) == []
    print(f"\n{event['message']}")


# Well above a step's time: on a loaded CI machine a local step took over 5 s (2026-12-06).
STALL_AFTER_S = 20


def test_a_job_that_stops_printing_steps_is_stopped_as_stalled_with_its_newest_save(
    ray_spec: RunSpec, ray_hook: GcpHook, sandbox: SandboxProcess
) -> None:
    sid = "nemo-rl-stall-1"
    overrides = ["checkpointing.save_period=2", "sandbox.hang_after_step=3"]
    address, headers, spec = _local_job(ray_spec, ray_hook, sid, overrides)
    recorder = _Clocked()
    trigger = _trigger(address, sid, stall_after_s=STALL_AFTER_S)
    trigger._log = recorder
    event = asyncio.run(first_event(trigger, timeout=240))
    detected = time.time()
    assert event["status"] == "stalled", event
    assert event["message"].startswith("stalled at step 3/20: no new step in the log for "), event["message"]
    assert f"(the bound is {STALL_AFTER_S}s); newest saved step 2" in event["message"]
    assert event["final_step"] == 2 and event["summary"]["steps_completed"] == 3
    assert any("Generation Worker Group" in line for line in event["tail"])
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address.url, headers=headers, verify=address.verify())
    deadline = time.monotonic() + 30
    while client.get_job_status(sid).value != "STOPPED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_job_status(sid).value == "STOPPED"
    assert _steps_on_disk(sandbox, spec, sid) == ["step_2"]
    last = max(t for line, t in zip(recorder.lines, recorder.times, strict=True) if "Avg Reward" in line)
    print(f"\nstall: {detected - last:.1f}s from step 3's results to the stall event (stall_after_s={STALL_AFTER_S})")
    print(event["message"])


# Six NeMo RL-shaped steps, 0.3 s apart, then the job ends.
SIX_STEPS_SCRIPT = (
    "import time\n"
    "for k in range(1, 7):\n"
    "    print(f'========================= Step {k}/6 =========================', flush=True)\n"
    "    print('\\U0001f4ca Training Results:', flush=True)\n"
    "    print('  \\u2022 Loss: 0.0100', flush=True)\n"
    "    print(f'  \\u2022 Avg Reward: {k / 10:.4f}', flush=True)\n"
    "    time.sleep(0.3)\n"
)


def test_a_trigger_run_again_after_a_restart_logs_only_the_lines_the_one_before_had_not(
    ray_spec: RunSpec, ray_hook: GcpHook
) -> None:
    ray = _ray(ray_spec, ray_hook)
    ray.submit(_request("nemo-rl-resume-log-1", f"python -c {_quoted(SIX_STEPS_SCRIPT)}"), {})
    positions = MemoryPositions()
    first, second = (_trigger(ray.address, "nemo-rl-resume-log-1") for _ in range(2))
    logs = [_Recorder(), _Recorder()]
    for trigger, recorder in zip((first, second), logs, strict=True):
        trigger._positions = positions  # type: ignore[assignment]
        trigger._log = recorder  # type: ignore[assignment]

    async def killed_after_step_two() -> None:
        # The triggerer dies once step 2's reward is in the task log (its task cancelled: nothing runs after).
        task = asyncio.ensure_future(first_event(first))
        while not any("Avg Reward: 0.2" in line for line in logs[0].lines):
            assert not task.done(), logs[0].lines
            await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(killed_after_step_two())
    resumed_at, _ = positions.saved["nemo-rl-resume-log-1"]
    assert resumed_at > 0 and positions.history
    event = asyncio.run(first_event(second))
    assert event["status"] == "success", event
    # The new trigger read the whole log (its summary has every step) and logged only what the first had not.
    assert event["summary"]["steps_completed"] == 6
    assert f"{FOLLOWING}nemo-rl-resume-log-1{RESUMED_AT}{resumed_at}" in logs[1].lines
    # (Ray's log starts with the entrypoint, the script's source: only the printed lines count.)
    printed = [m.group(1) for r in logs for line in r.lines if (m := re.search(r"• Avg Reward: ([\d.]+)$", line))]
    assert printed == [f"{k / 10:.4f}" for k in range(1, 7)], logs
    assert not any(line.endswith("• Avg Reward: 0.1000") for line in logs[1].lines)
