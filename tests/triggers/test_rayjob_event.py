"""The Ray job trigger's output stays small whatever the job prints: Airflow logs the event as one line, and the
trigger's own lines land in the task log (no line over 8 KB, issue 13)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nemo_rl_gke.triggers.rayjob import RayJobTrigger
from tests.triggers.scripted_api import scripted_api

JOB = "nemo-rl-size-1"
LINE_LIMIT_BYTES = 8 * 1024


class Recorder:
    """Stands in for the trigger's logger and keeps every line it logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(message % args if args else message)

    warning = debug = exception = error = info


def _long_run_log(steps: int) -> str:
    """A NeMo RL-shaped log of ``steps`` steps, with lines far longer than any limit (emoji are 4 bytes each)."""
    parts = []
    for k in range(1, steps + 1):
        parts += [
            f"========================= Step {k}/{steps} =========================",
            "📊 Training Results:",
            "  • Loss: 0.0123",
            f"  • Avg Reward: {0.1 + 0.8 * k / steps:.4f}",
            "⏱️  Timing:",
            "  • Total step time: 12.34s",
            "  • generation: 6.17s (50.0%)",
            "(VllmGenerationWorker pid=12, ip=10.0.0.5) " + "🚀" * 5000,
        ]
        if k % 10 == 0:
            parts.append(f"Saving checkpoint for step {k}...")
    return "\n".join(parts) + "\n"


def _follow(status: dict[str, Any], log: str) -> tuple[dict[str, Any], list[str]]:
    scripts = {f"/api/jobs/{JOB}": [(200, status)], f"/api/jobs/{JOB}/logs": [(200, {"logs": log})]}

    async def run() -> tuple[dict[str, Any], list[str]]:
        async with scripted_api(scripts) as api:
            trigger = RayJobTrigger(address=api.url, submission_id=JOB, poll_interval=0.01)
            recorder = Recorder()
            trigger._log = recorder  # type: ignore[assignment]
            [event] = [e.payload async for e in trigger.run()]
            return event, recorder.lines

    return asyncio.run(asyncio.wait_for(run(), 60))


def test_the_event_of_a_long_job_is_a_summary_not_every_step() -> None:
    event, lines = _follow({"submission_id": JOB, "status": "SUCCEEDED"}, _long_run_log(500))
    assert event["status"] == "success"
    assert event["summary"]["steps_completed"] == 500 and event["final_step"] == 500
    assert len(json.dumps(event, ensure_ascii=False).encode()) < LINE_LIMIT_BYTES
    assert max(len(line.encode()) for line in lines) < LINE_LIMIT_BYTES


def test_a_failed_job_s_huge_message_and_tail_are_clipped() -> None:
    failed = {"submission_id": JOB, "status": "FAILED", "message": "Job failed. Last logs:\n" + "é" * 100_000}
    event, lines = _follow(failed, "x" * 50_000 + "\n" + ("y" * 9000 + "\n") * 40)
    assert event["status"] == "failed"
    assert "more chars]" in event["message"]
    assert event["tail"] and all(len(line) <= 400 for line in event["tail"])
    assert len(json.dumps(event, ensure_ascii=False).encode()) < LINE_LIMIT_BYTES
    assert max(len(line.encode()) for line in lines) < LINE_LIMIT_BYTES


def test_a_ray_without_the_tail_websocket_is_followed_by_whole_downloads() -> None:
    # The scripted API answers the /logs/tail upgrade 404, as a Ray or a proxy without it would: the trigger says so
    # once and reads the same lines from whole-log polls.
    event, lines = _follow({"submission_id": JOB, "status": "SUCCEEDED"}, "step one\nstep two\n")
    assert event["status"] == "success"
    assert sum("following its log by whole downloads (HTTP 404" in line for line in lines) == 1, lines
    assert [line for line in lines if line.startswith("[ray job]")] == ["[ray job] step one", "[ray job] step two"]
