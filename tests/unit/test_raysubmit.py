"""The Ray SDK's log records reach the task log at their own level, not as stderr (which Airflow shows as errors); the
Ray token's Secret; the submit task's bound."""

from __future__ import annotations

import logging

import pytest

from nemo_rl_gke.ray.hooks import route_ray_logs


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


def test_the_ray_token_comes_from_kuberays_secret_or_a_clear_error() -> None:
    import base64

    from nemo_rl_gke.ray.submit import RayTokenMissingError, ray_token_headers, ray_token_of, ray_token_secret_path

    path = ray_token_secret_path("default", "ray-cluster-kuberay")
    assert path == "/api/v1/namespaces/default/secrets/ray-cluster-kuberay"
    secret = {"data": {"auth_token": base64.b64encode(b"s3cret-token\n").decode()}}
    assert ray_token_of(secret, path) == "s3cret-token"
    assert ray_token_headers("s3cret-token") == {"X-Ray-Authorization": "Bearer s3cret-token"}
    assert ray_token_headers(None) == {}
    with pytest.raises(RayTokenMissingError, match=r"does not exist\. KubeRay 1\.5\.1"):
        ray_token_of(None, path)
    with pytest.raises(RayTokenMissingError, match="has no auth_token"):
        ray_token_of({"data": {"other": "eA=="}}, path)
    with pytest.raises(RayTokenMissingError, match="has no auth_token"):
        ray_token_of({"data": {"auth_token": "not base64!"}}, path)


def test_the_kubernetes_clients_never_log_a_secrets_body(caplog: pytest.LogCaptureFixture) -> None:
    from nemo_rl_gke.ray.submit import KUBE_REST_LOGGERS, hide_secret_bodies

    hide_secret_bodies()
    hide_secret_bodies()  # idempotent: one filter each
    secret = b'{"kind":"Secret","data":{"auth_token":"c2VjcmV0LXRva2Vu"}}'
    for name in KUBE_REST_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
        logger = logging.getLogger(name)
        assert len(logger.filters) == 1
        # As kubernetes(_asyncio).client.rest logs every response body: bytes, compact (GKE) or spaced (sandbox).
        logger.debug("response body: %s", secret)
        logger.debug("response body: %s", secret.decode().replace(":", ": "))
        logger.debug("response body: %s", b'{"kind":"ConfigMap","data":{"a":"b"}}')
    shown = [record.getMessage() for record in caplog.records]
    assert shown == ["""response body: b'{"kind":"ConfigMap","data":{"a":"b"}}'"""] * 2


def test_the_secret_name_follows_kuberays_checkname() -> None:
    from nemo_rl_gke.ray.submit import kuberay_name

    assert kuberay_name("rc") == "rc"
    long_name = "a" * 10 + "b" * 50
    assert kuberay_name(long_name) == "b" * 50  # the last 50 characters, as utils.CheckName keeps
    assert kuberay_name("1rc") == "rrc"


def test_the_submit_task_is_bounded_since_rays_client_sets_no_request_timeout() -> None:
    from nemo_rl_gke.operators.rayjob import SubmitRayJobOperator
    from nemo_rl_gke.run.topology import SUBMIT

    operator = SubmitRayJobOperator(step=SUBMIT)
    assert operator.execution_timeout is not None and operator.execution_timeout.total_seconds() == 15 * 60
