"""Log bytes the Ray job trigger fetches over ~100 polls of a growing log, over its final size (target <= 1.2).

A real local Ray head (loopback only, its own ports and temp dir) runs a job whose driver log grows the whole time
the triggers poll it, to twice ``QUICK_END_BYTES``. Two RayJobTriggers follow the same job side by side:

- the follower as it is: Ray's ``/api/jobs/{id}/logs/tail`` websocket, each byte once (ray/log_tail.py);
- the old way: ``GET /api/jobs/{id}/logs`` every poll, the whole log each time (``log_stream=False``, also the
  fallback where no websocket gets through).

Both ratios are printed; the new one must meet the target. A log growing linearly over N polls costs the old way
about N/2 times its size. Exit status: 0 when the target is met, 1 when missed, 2 when the bench failed. The Ray
head is stopped by its own process group on every way out.

    .venv/bin/python bench/log_follow.py [--polls 100] [--interval 0.1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from sandbox.ports import free_port  # noqa: E402

from nemo_rl_gke.kube.access import DashboardAddress  # noqa: E402
from nemo_rl_gke.plan.ray_job import JobRequest  # noqa: E402
from nemo_rl_gke.ray.hooks import RayJobsHook  # noqa: E402
from nemo_rl_gke.ray.log_tail import QUICK_END_BYTES  # noqa: E402
from nemo_rl_gke.triggers.rayjob import RayJobTrigger  # noqa: E402

TARGET = 1.2
# The log ends at twice QUICK_END_BYTES, whatever the poll count: a shorter terminal log is downloaded whole once more
# by design (seconds sooner than Ray's close of the stream), so only a longer one measures what each byte once saves.
FINAL_LOG_BYTES = 2 * QUICK_END_BYTES
# The job prints for this many poll intervals and the triggers go on polling until it ends: ~100 polls each.
JOB_ID = "bench-log-follow-1"


class BenchError(RuntimeError):
    """The bench could not measure (Ray did not start, the job failed)."""


def start_ray(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A local Ray head on loopback (as the sandbox's KubeRay starts one) and its dashboard URL."""
    ports = {flag: free_port() for flag in ("--port", "--dashboard-port", "--ray-client-server-port")}
    temp_dir = tempfile.mkdtemp(prefix="bnray-")  # Ray's socket paths must stay short
    args = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block"]
    args += [f"{flag}={port}" for flag, port in ports.items()]
    args += ["--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}", "--num-cpus=2"]
    args += ["--object-store-memory=200000000", "--include-dashboard=true", "--disable-usage-stats"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # Its /tmp too, removed with it: SIGKILLed, Ray's dashboard would leave its forkserver's socket dir in the host's.
    env["TMPDIR"] = temp_dir
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with open(workdir / "ray.log", "ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    process.temp_dir = temp_dir  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{ports['--dashboard-port']}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"ray start exited with {process.returncode}: see {workdir / 'ray.log'}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/api/version", timeout=2):
            return process, url
        time.sleep(0.5)
    stop_ray(process)
    raise BenchError("the Ray dashboard did not answer within 180 s")


def stop_ray(process: subprocess.Popen[bytes]) -> None:
    """Stop that Ray by its process group (never ``ray stop``, which stops every Ray on the machine), at once: its own
    graceful stop outlasts any short grace (see ``sandbox.kuberay._stop``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    shutil.rmtree(getattr(process, "temp_dir", ""), ignore_errors=True)


class _WarningsOnly:
    """Stands in for a trigger's logger: its warnings and errors go to stderr, the job's lines nowhere."""

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        """Drop it."""

    debug = info

    def warning(self, message: str, *args: Any, **kwargs: Any) -> None:
        """Show it."""
        print(message % args if args else message, file=sys.stderr)

    error = exception = warning


def _counting(trigger: RayJobTrigger) -> list[int]:
    """Count the trigger's log reads (one per poll)."""
    polls = [0]
    read = trigger._read_log

    async def counted(*args: Any, **kwargs: Any) -> Any:
        polls[0] += 1
        return await read(*args, **kwargs)

    trigger._read_log = counted  # type: ignore[method-assign]
    return polls


async def _follow(url: str, interval: float) -> tuple[list[RayJobTrigger], list[int], list[dict[str, Any]]]:
    triggers = [
        RayJobTrigger(url, JOB_ID, poll_interval=interval, zero_learning_steps=0),
        RayJobTrigger(url, JOB_ID, poll_interval=interval, zero_learning_steps=0, log_stream=False),
    ]
    polls = [_counting(t) for t in triggers]
    for trigger in triggers:
        trigger._log = _WarningsOnly()  # type: ignore[assignment]  # the job's lines, twice, would bury the result

    async def first(trigger: RayJobTrigger) -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise BenchError("the trigger sent no event")

    events = await asyncio.wait_for(asyncio.gather(*(first(t) for t in triggers)), 600)
    return triggers, [p[0] for p in polls], list(events)


def measure(polls: int, interval: float) -> bool:
    """Run the job, follow it both ways, print the ratios; True when the new one meets the target."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-log-follow-"))
    process, url = start_ray(workdir)
    try:
        lines = polls * 4  # four lines per poll interval, printed evenly over ~polls intervals
        line_chars = FINAL_LOG_BYTES // lines
        script = (
            "import time\n"
            f"for k in range({lines}):\n"
            f"    print(f'step line {{k:06d}} ' + 'x' * {line_chars - 18}, flush=True)\n"
            f"    time.sleep({interval / 4!r})\n"
        )
        ray = RayJobsHook(DashboardAddress(url, needs_token=False))
        ray.submit(JobRequest(JOB_ID, f"python -c {shlex.quote(script)}", {}, (), ()), {})
        triggers, counts, events = asyncio.run(_follow(url, interval))
        if any(e["status"] != "success" for e in events):
            raise BenchError(f"the job did not succeed: {[e['message'] for e in events]}")
        final = len(ray.logs(JOB_ID).encode())
    finally:
        stop_ray(process)
        shutil.rmtree(workdir, ignore_errors=True)
    new, old = (t.bytes_fetched / final for t in triggers)
    print(f"polls: {counts[0]} (tail websocket), {counts[1]} (whole log)")
    print(f"final log size: {final:,} bytes")
    print(f"fetched/size, tail websocket (the follower): {new:.2f}")
    print(f"fetched/size, whole log every poll (old):    {old:.2f}")
    met = new <= TARGET
    print(f"target <= {TARGET}: {'met' if met else 'MISSED'}")
    return met


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the bench; the exit status says whether the target was met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=100, help="poll intervals the job's log grows over")
    parser.add_argument("--interval", type=float, default=0.1, help="poll interval of both triggers (s)")
    parser.add_argument("--quick", action="store_true", help="20 polls (the test's mode)")
    args = parser.parse_args(argv)
    try:
        return 0 if measure(20 if args.quick else args.polls, args.interval) else 1
    except (BenchError, OSError, KeyboardInterrupt) as exc:
        print(f"bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
