"""The seed file the README's local-Airflow guide starts the sandbox with is what the demo seeds for the same conf,
and the sandbox takes it: an apply run of ``include/conf/local.json`` finds its reservation and export bucket."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox.demo import demo_seed
from sandbox.testing import request_json, start_sandbox

from tests.paths import ROOT

SEED = ROOT / "include/conf/sandbox-seed.json"


def test_the_guides_seed_file_is_the_demos_seed_for_the_local_conf() -> None:
    local = json.loads((ROOT / "include/conf/local.json").read_text())
    assert json.loads(SEED.read_text()) == demo_seed(local)
    assert f"--seed {SEED.relative_to(ROOT)}" in (ROOT / "README.md").read_text()


def test_a_sandbox_started_with_it_has_the_reservation_and_the_bucket(tmp_path: Path) -> None:
    sandbox = start_sandbox(tmp_path / "sb", latency_scale=0.0, seed=json.loads(SEED.read_text()))
    try:
        reservations = request_json(f"{sandbox.url}/sandbox/reservations")
        assert [r["name"] for r in reservations["reservations"]] == ["nemo-rl-reservation"]
        bucket = request_json(f"{sandbox.url}/storage/v1/b/nemo-rl-demo-nemo-rl-checkpoints")
        assert bucket["name"] == "nemo-rl-demo-nemo-rl-checkpoints"
    finally:
        sandbox.stop()


def test_a_relative_state_dir_is_taken_as_an_absolute_one(tmp_path: Path) -> None:
    # The guide's `--state .sandbox`: Lustre's directories live under it, and each Ray job runs in a working dir of
    # its own, so a relative path would name a different place in every job (validation found no checkpoint).
    import os
    import subprocess
    import sys
    import time

    from sandbox.ports import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "sandbox", "serve", "--port", str(port), "--state", ".sandbox",
               "--seed", str(SEED), "--latency-scale", "0"]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = request_json(f"http://127.0.0.1:{port}/sandbox/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        assert health["state_dir"] == str(tmp_path / ".sandbox")
    finally:
        process.terminate()
        process.wait(timeout=30)
