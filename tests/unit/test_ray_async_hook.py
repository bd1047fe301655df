"""The async Ray Jobs hook's answers to what a Jobs API (here a scripted one on 127.0.0.1) can say: which errors are
retried, which are final, and the driver log from an offset when the log was replaced or the websocket is refused.
The real Ray behind the API server's proxy is tests/gcp/test_rayjob.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nemo_rl_gke.ray.async_hooks import LogText, RayJobsApiError, RayJobsAsyncHook, RayJobsTransientError
from tests.triggers.scripted_api import Answer, ScriptedApi, scripted_api

JOB = "nemo-rl-hook-1"


def _with_api(scripts: dict[str, list[Answer]], test: Callable[[RayJobsAsyncHook, ScriptedApi], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with scripted_api(scripts) as api, RayJobsAsyncHook(api.url) as hook:
            return await test(hook, api)

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_status_is_none_for_no_such_job_retried_for_5xx_and_final_for_other_errors() -> None:
    path = f"/api/jobs/{JOB}"
    answers: list[Answer] = [(200, {"status": "RUNNING"}), (404, "not found"), (503, "busy"), (429, {})]
    scripts = {path: [*answers, (400, "bad"), (200, ["not", "an", "object"])]}

    async def test(hook: RayJobsAsyncHook, api: ScriptedApi) -> None:
        assert await hook.status(JOB) == {"status": "RUNNING"}
        assert await hook.status(JOB) is None
        for _ in range(2):
            with pytest.raises(RayJobsTransientError, match=r"HTTP (503|429)"):
                await hook.status(JOB)
        with pytest.raises(RayJobsApiError, match="HTTP 400: bad") as error:
            await hook.status(JOB)
        assert error.value.status == 400
        with pytest.raises(RayJobsApiError, match="HTTP 200"):
            await hook.status(JOB)
        # Without the Google token (not through the API server) and before a Ray token: JSON asked, nothing else.
        sent = {k.lower() for k in api.requests[0].headers}
        assert "accept" in sent and not sent & {"authorization", "x-ray-authorization"}

    _with_api(scripts, test)


def test_a_stop_is_sent_once_and_any_answer_but_200_is_its_outcome() -> None:
    path = f"/api/jobs/{JOB}/stop"
    scripts = {path: [(200, {"stopped": True}), (200, {"stopped": False}), (503, "busy"), (404, "no such job")]}

    async def test(hook: RayJobsAsyncHook, api: ScriptedApi) -> None:
        assert await hook.stop(JOB) is True
        assert await hook.stop(JOB) is False  # it was not running
        with pytest.raises(RayJobsApiError, match="HTTP 503: busy"):
            await hook.stop(JOB)
        with pytest.raises(RayJobsApiError, match="HTTP 404"):
            await hook.stop(JOB)
        assert [r.method for r in api.requests] == ["POST"] * 4

    _with_api(scripts, test)


def test_logs_from_an_offset_a_replaced_log_and_an_error_answer() -> None:
    logs = f"/api/jobs/{JOB}/logs"
    scripts = {
        logs: [(200, {"logs": "0123456789"}), (200, {"logs": "0123456789"}), (503, "busy"), (200, {"logs": "ab"})]
    }

    async def test(hook: RayJobsAsyncHook, api: ScriptedApi) -> list[LogText]:
        # The scripted API has no /logs/tail websocket (404 to the upgrade): whole downloads, said on the first read.
        return [await hook.logs(JOB, offset) for offset in (4, 10, 10, 10)]

    reads = _with_api(scripts, test)
    assert reads[0] == LogText("456789", 4, "HTTP 404 to the websocket upgrade")
    assert reads[1] == LogText("", 10)
    assert reads[2] == LogText(None, None)  # an error answer is no text, not an empty (replaced) log
    assert reads[3] == LogText("ab", None)  # shorter than what was read: a new log, all of it
