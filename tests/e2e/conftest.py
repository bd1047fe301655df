"""Fixtures of the e2e modules: one sandbox per module (seeded with the reservation), its connections, the DAG."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.testing import SandboxProcess, start_sandbox

from tests.e2e.harness import SEED, connection_env, load_dag


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """A sandbox for this module, operations instant (latency scale 0)."""
    with start_sandbox(tmp_path_factory.mktemp("sandbox"), latency_scale=0.0, seed=SEED) as process:
        yield process


@pytest.fixture(scope="module")
def env(sandbox: SandboxProcess, airflow_db: None) -> Iterator[dict[str, str]]:
    """The sandbox connections in this process's environment (for dag.test) and for subprocesses."""
    values = connection_env(sandbox.url)
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    yield values
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def dag(env: dict[str, str]) -> Any:
    """The DAG as Airflow parses it from dags/."""
    return load_dag()


@pytest.fixture
def fresh_sandbox(sandbox: SandboxProcess) -> Iterator[None]:
    """A test that starts from an empty sandbox and leaves no fault behind (opt in with ``usefixtures``)."""
    sandbox.reset()
    yield
    sandbox.clear_faults()
