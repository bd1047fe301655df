"""The Ray SDK's log records reach the task log at their own level, not as stderr (which Airflow shows as errors)."""

from __future__ import annotations

import logging

import pytest

from nemo_rl_gke.raysubmit import route_ray_logs


def test_ray_sdk_records_go_through_python_logging_not_stderr(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import ray.job_submission  # noqa: F401  (importing Ray installs its stderr handler)

    ray_logger = logging.getLogger("ray")
    route_ray_logs()
    with caplog.at_level(logging.INFO, logger="ray"):
        logging.getLogger("ray.dashboard.modules.dashboard_sdk").info("Uploading package gcs://_ray_pkg_x.zip.")
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("ray")]
    assert records == [("ray.dashboard.modules.dashboard_sdk", "INFO", "Uploading package gcs://_ray_pkg_x.zip.")]
    assert "Uploading package" not in capfd.readouterr().err
    route_ray_logs()  # idempotent
    assert ray_logger.propagate
