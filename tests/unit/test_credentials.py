"""gcp/credentials.py: one build per connection and process, a new one whenever what they are built from changes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_gke.gcp import credentials


@dataclass
class FakeHook:
    """What GoogleBaseHook exposes that the credentials are built from."""

    extras: dict[str, Any] = field(default_factory=lambda: {"keyfile_dict": '{"private_key": "k1"}'})
    gcp_conn_id: str = "google_cloud_default"
    scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)
    impersonation_chain: str | None = None
    quota_project_id: str | None = None


class Builds:
    """A build function that counts its calls and returns a new object each time."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> tuple[object, str]:
        self.count += 1
        return object(), "project"


def test_hooks_on_the_same_connection_share_one_build() -> None:
    build = Builds()
    first = credentials.shared_credentials(FakeHook(), build)
    second = credentials.shared_credentials(FakeHook(), build)
    assert build.count == 1 and first[0] is second[0]


@pytest.mark.parametrize(
    "change",
    [
        {"extras": {"keyfile_dict": '{"private_key": "k2"}'}},  # a rotated key in the connection
        {"gcp_conn_id": "other"},
        {"scopes": ("https://www.googleapis.com/auth/devstorage.read_only",)},
        {"impersonation_chain": "sa@p.iam.gserviceaccount.com"},
        {"quota_project_id": "billing-project"},
    ],
    ids=["key", "conn", "scopes", "impersonation", "quota"],
)
def test_anything_the_credentials_are_built_from_changing_builds_anew(change: dict[str, Any]) -> None:
    build = Builds()
    first = credentials.shared_credentials(FakeHook(), build)
    other = credentials.shared_credentials(FakeHook(**change), build)
    assert build.count == 2 and other[0] is not first[0]


def test_a_key_file_rewritten_in_place_builds_anew(tmp_path: Path) -> None:
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"private_key": "k1"}))
    hook = FakeHook(extras={"key_path": str(key)})
    build = Builds()
    credentials.shared_credentials(hook, build)
    credentials.shared_credentials(hook, build)
    assert build.count == 1
    key.write_text(json.dumps({"private_key": "k2, longer"}))
    os.utime(key, ns=(1, 1))  # a different mtime even where the clock is coarse
    credentials.shared_credentials(hook, build)
    assert build.count == 2


def test_a_failed_build_is_not_kept() -> None:
    def failing() -> tuple[object, str]:
        raise ValueError("Invalid key JSON.")

    with pytest.raises(ValueError, match="Invalid key JSON"):
        credentials.shared_credentials(FakeHook(), failing)
    build = Builds()
    credentials.shared_credentials(FakeHook(), build)
    assert build.count == 1


def test_the_cache_is_bounded_and_the_key_holds_no_secret() -> None:
    build = Builds()
    for n in range(credentials.MAX_ENTRIES + 5):
        credentials.shared_credentials(FakeHook(extras={"keyfile_dict": f"secret-{n}"}), build)
    assert len(credentials._cache) == credentials.MAX_ENTRIES
    assert not any("secret" in key for key in credentials._cache)


def test_the_sync_hooks_share_the_credentials_the_provider_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from nemo_rl_gke.gcp.hooks import GcpHook

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key = {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "1",
        "private_key": pem.decode(),
        "client_email": "runner@p.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",
    }
    extra = {"keyfile_dict": json.dumps(key), "project": "p"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    first, second = GcpHook().get_credentials(), GcpHook().get_credentials()
    assert first is second and first.service_account_email == "runner@p.iam.gserviceaccount.com"
    assert GcpHook().get_credentials_and_project_id()[1] == "p"
    credentials.clear()
    assert GcpHook().get_credentials() is not first
