"""Request bodies in the API server's protobuf encoding, for the kinds kubectl's typed clients send that way.

``kubectl create configmap|secret|namespace|serviceaccount`` and ``kubectl auth can-i`` post
``application/vnd.kubernetes.protobuf``: the ``k8s\\0`` magic, then a ``runtime.Unknown`` (typeMeta 1: apiVersion 1,
kind 2; raw 2) whose raw bytes are the kind's message as k8s.io/api's ``generated.proto`` numbers its fields
(apimachinery pkg/runtime/serializer/protobuf/protobuf.go ``Decode``; runtime/generated.proto ``Unknown``). This
reads those messages into the JSON object they stand for. A kind or field it does not know is a 415 naming it (send
JSON instead), never a silently smaller object.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from sandbox.kube_errors import KubeError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# Field number -> (JSON name, type): "string", "bytes" (base64 in JSON), "bool", "int", "time" (metav1.Time: seconds 1,
# nanos 2), "map" (string to string), "map-bytes" (string to base64), "strings" (repeated string), "[Message]"
# (repeated), or a message name. Go's generated marshallers write every non-pointer field, empty ones too; JSON's
# omitempty leaves those out, and so does this.
Fields = dict[int, tuple[str, str]]
MESSAGES: dict[str, Fields] = {
    # k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto
    "ObjectMeta": {
        1: ("name", "string"),
        2: ("generateName", "string"),
        3: ("namespace", "string"),
        4: ("selfLink", "string"),
        5: ("uid", "string"),
        6: ("resourceVersion", "string"),
        7: ("generation", "int"),
        8: ("creationTimestamp", "time"),
        11: ("labels", "map"),
        12: ("annotations", "map"),
        14: ("finalizers", "strings"),
    },
    # k8s.io/api/core/v1/generated.proto
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map"),
        3: ("binaryData", "map-bytes"),
        4: ("immutable", "bool"),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map-bytes"),
        3: ("type", "string"),
        4: ("stringData", "map"),
        5: ("immutable", "bool"),
    },
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"), 3: ("status", "NamespaceStatus")},
    "NamespaceSpec": {1: ("finalizers", "strings")},
    "NamespaceStatus": {1: ("phase", "string")},
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta"),
        3: ("imagePullSecrets", "[LocalObjectReference]"),
        4: ("automountServiceAccountToken", "bool"),
    },
    "LocalObjectReference": {1: ("name", "string")},
    # k8s.io/api/authorization/v1/generated.proto
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "SelfSubjectAccessReviewSpec"),
        3: ("status", "SubjectAccessReviewStatus"),
    },
    "SubjectAccessReviewStatus": {
        1: ("allowed", "bool"),
        2: ("reason", "string"),
        3: ("evaluationError", "string"),
        4: ("denied", "bool"),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes"),
        2: ("nonResourceAttributes", "NonResourceAttributes"),
    },
    "ResourceAttributes": {
        1: ("namespace", "string"),
        2: ("verb", "string"),
        3: ("group", "string"),
        4: ("version", "string"),
        5: ("resource", "string"),
        6: ("subresource", "string"),
        7: ("name", "string"),
    },
    "NonResourceAttributes": {1: ("path", "string"), 2: ("verb", "string")},
}
# The kinds a protobuf body may be, by (apiVersion, kind).
TOP_LEVEL = {
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
}


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as ints, length-delimited as bytes."""
    out: list[tuple[int, int | bytes]] = []
    index = 0

    def varint() -> int:
        nonlocal index
        value = shift = 0
        while True:
            if index >= len(data):
                raise KubeError(400, "BadRequest", "the protobuf body is truncated")
            byte = data[index]
            index += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while index < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            size = varint()
            if index + size > len(data):
                raise KubeError(400, "BadRequest", "the protobuf body is truncated")
            out.append((number, data[index : index + size]))
            index += size
        else:
            raise KubeError(400, "BadRequest", f"the protobuf body has a field of wire type {wire}")
    return out


def _bytes(value: int | bytes, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise KubeError(400, "BadRequest", f"{where}: expected a length-delimited field")
    return value


def message(data: bytes, name: str) -> dict[str, Any]:
    """One message of :data:`MESSAGES` as its JSON object."""
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, value in fields(data):
        if number not in schema:
            raise KubeError(
                415,
                "UnsupportedMediaType",
                f"the sandbox does not decode field {number} of {name} from protobuf: send application/json",
            )
        key, kind = schema[number]
        _put(out, key, kind, value, f"{name}.{key}")
    return out


def _put(out: dict[str, Any], key: str, kind: str, value: int | bytes, where: str) -> None:
    """One decoded field into its message's JSON object: scalars (proto3 defaults left out, as JSON leaves them),
    a time as RFC 3339, bytes as base64, a map entry, a repeated string or message, or a nested message."""
    if kind in {"bool", "int"}:
        if not isinstance(value, int):
            raise KubeError(400, "BadRequest", f"{where}: expected a varint")
        if value or kind == "bool":
            out[key] = bool(value) if kind == "bool" else value
    elif kind == "string":
        if text := _bytes(value, where).decode():
            out[key] = text
    elif kind == "time":
        seconds = dict(fields(_bytes(value, where))).get(1, 0)
        if isinstance(seconds, int) and seconds:
            out[key] = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    elif kind == "bytes":
        out[key] = base64.b64encode(_bytes(value, where)).decode()
    elif kind in ("map", "map-bytes"):
        entry = dict(fields(_bytes(value, where)))
        item_key = _bytes(entry.get(1, b""), where).decode()
        raw = _bytes(entry.get(2, b""), where)
        out.setdefault(key, {})[item_key] = raw.decode() if kind == "map" else base64.b64encode(raw).decode()
    elif kind == "strings":
        out.setdefault(key, []).append(_bytes(value, where).decode())
    elif kind.startswith("["):
        out.setdefault(key, []).append(message(_bytes(value, where), kind[1:-1]))
    else:
        out[key] = message(_bytes(value, where), kind)


def decode(raw: bytes) -> dict[str, Any]:
    """A ``k8s\\0`` + ``runtime.Unknown`` body as the JSON object it stands for (apiVersion and kind included)."""
    if not raw.startswith(MAGIC):
        raise KubeError(400, "BadRequest", "the protobuf body lacks the k8s magic prefix")
    envelope = dict(fields(raw[len(MAGIC) :]))
    type_meta = dict(fields(_bytes(envelope.get(1, b""), "Unknown.typeMeta")))
    api_version = _bytes(type_meta.get(1, b""), "TypeMeta.apiVersion").decode()
    kind = _bytes(type_meta.get(2, b""), "TypeMeta.kind").decode()
    if (api_version, kind) not in TOP_LEVEL:
        known = ", ".join(sorted(k for _, k in TOP_LEVEL))
        raise KubeError(
            415,
            "UnsupportedMediaType",
            f"the sandbox decodes protobuf bodies of {known} only, not {api_version}/{kind}: send application/json",
        )
    body = message(_bytes(envelope.get(2, b""), "Unknown.raw"), kind)
    body.setdefault("metadata", {})
    return {"apiVersion": api_version, "kind": kind, **body}
