"""The triggerer imports a trigger's module on its event loop, which every deferred task of the deployment shares:
importing one must load no HTTP client at all. Not the sync Google, Kubernetes or Ray clients (compute_v1 alone took
2.3 s, and the RayJobTrigger's module 7.8 s in all, on this machine), and not the async ones it runs on either
(aiohttp, kubernetes_asyncio, Airflow's Google base hook: 0.8 to 1.7 s of CPU per trigger module with Airflow's
triggerer already imported): the trigger imports those in a worker thread when it runs (triggers/clients.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TRIGGERS = ("operations", "lease", "raycluster", "rayjob")
# What only the sync hooks use: the clients the triggers must never pull in. (googleapiclient.discovery is not among
# them: Airflow's Google provider imports it for its async credentials hook, as it does for its own triggers.)
SYNC_CLIENTS = ("google.cloud.compute_v1", "google.cloud.container_v1", "kubernetes", "ray")
ASYNC_CLIENTS = ("aiohttp", "kubernetes_asyncio", "airflow.providers.google.common.hooks.base_google")


@pytest.mark.parametrize("module", TRIGGERS)
def test_a_trigger_module_imports_no_client(module: str) -> None:
    code = (
        "import sys\n"
        "import airflow.jobs.triggerer_job_runner\n"  # what the triggerer has loaded when it imports a trigger
        f"before = set(sys.modules)\n"
        f"import nemo_rl_gke.triggers.{module}\n"
        f"loaded = [m for m in {SYNC_CLIENTS + ASYNC_CLIENTS!r} if m in set(sys.modules) - before]\n"
        "print(loaded)\n"
    )
    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": plugins}
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
