"""Protobuf bodies as kubectl's typed clients send them (``kubectl create configmap``, ``auth can-i``)."""

from __future__ import annotations

import base64

import pytest
from sandbox.kube_errors import KubeError

from sandbox import kube_authz, kube_protobuf


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (lengths below 128 here)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def _varint(number: int, value: int) -> bytes:
    return bytes([number << 3, value])


def _entry(number: int, key: bytes, value: bytes) -> bytes:
    return _field(number, _field(1, key) + _field(2, value))


def _body(api_version: bytes, kind: bytes, message: bytes) -> bytes:
    return kube_protobuf.MAGIC + _field(1, _field(1, api_version) + _field(2, kind)) + _field(2, message)


def test_a_configmap_as_kubectl_create_configmap_sends_it() -> None:
    meta = _field(1, b"watched") + _field(3, b"default") + _entry(11, b"team", b"rl")
    message = _field(1, meta) + _entry(2, b"phase", b"pending") + _entry(2, b"b", b"2") + _varint(4, 1)
    assert kube_protobuf.decode(_body(b"v1", b"ConfigMap", message)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "watched", "namespace": "default", "labels": {"team": "rl"}},
        "data": {"phase": "pending", "b": "2"},
        "immutable": True,
    }


def test_a_secrets_bytes_are_base64_in_json() -> None:
    message = _field(1, _field(1, b"s")) + _entry(2, b"token", b"\x00\xffraw") + _field(3, b"Opaque")
    body = kube_protobuf.decode(_body(b"v1", b"Secret", message))
    assert body["data"] == {"token": base64.b64encode(b"\x00\xffraw").decode()} and body["type"] == "Opaque"


def test_a_review_as_kubectl_auth_can_i_sends_it() -> None:
    attributes = _field(2, b"create") + _field(3, b"ray.io") + _field(5, b"rayclusters") + _field(1, b"default")
    message = _field(1, b"") + _field(2, _field(1, attributes))
    body = kube_protobuf.decode(_body(b"authorization.k8s.io/v1", b"SelfSubjectAccessReview", message))
    assert body["spec"] == {
        "resourceAttributes": {"verb": "create", "group": "ray.io", "resource": "rayclusters", "namespace": "default"}
    }
    assert kube_authz.review(body)["status"]["allowed"] is True


def test_what_it_cannot_read_is_refused_by_name_never_dropped() -> None:
    with pytest.raises(KubeError, match="magic") as bad:
        kube_protobuf.decode(b"{}")
    assert bad.value.code == 400
    with pytest.raises(KubeError, match="not apps/v1/Deployment: send application/json") as kind:
        kube_protobuf.decode(_body(b"apps/v1", b"Deployment", b""))
    assert kind.value.code == 415
    # ownerReferences (ObjectMeta field 13) is not decoded: a 415 naming it, not an object without it.
    with pytest.raises(KubeError, match="field 13 of ObjectMeta") as field:
        kube_protobuf.decode(_body(b"v1", b"ConfigMap", _field(1, _field(13, b"x"))))
    assert field.value.code == 415
    with pytest.raises(KubeError, match="truncated"):
        kube_protobuf.decode(_body(b"v1", b"ConfigMap", b"\x0a\x05ab"))
