"""The shape of one Google Cloud REST call in the plan, and how a typed message becomes its JSON body.

Bodies are built as google-cloud (proto-plus) messages so a misspelt field raises at once; :func:`message_body`
turns them into the JSON the REST API takes, the way gcloud sends it (see /work/notes/gcloud.md). The APIs without a
google-cloud client (Service Networking, Cloud Resource Manager v1) are checked against the discovery documents bundled
with google-api-python-client instead (:func:`discovery_request`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    import proto

# gcloud resolves every compute reference it puts in a body (a subnet's network, a network profile, ...) to this full
# URL (gcloud.md §1-4). The API also takes relative paths; we send what gcloud sends.
COMPUTE_URL_BASE = "https://compute.googleapis.com/compute/v1/"


class DiscoveryMismatchError(ValueError):
    """A hand-built request does not match the API's discovery document (unknown method, field or parameter)."""


@dataclass(frozen=True)
class ApiRequest:
    """One REST call of the plan: what the action sends, and what the plan prints.

    ``path`` is the REST path with its version prefix and any query string, relative to the service's endpoint.
    ``message`` is the google-cloud message the body was built from (``None`` when the call has no body or the API has
    no google-cloud client); the actions pass it to the client, the plan prints ``body``.
    """

    service: str
    method: str
    http_method: str
    path: str
    body: dict[str, Any] | None
    resource: str
    message: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (without the message), for the plan, XCom and the CLI."""
        return {
            "service": self.service,
            "method": self.method,
            "http_method": self.http_method,
            "path": self.path,
            "body": self.body,
            "resource": self.resource,
        }


def compute_url(path: str) -> str:
    """The full compute URL of a relative resource path, in the form gcloud puts into request bodies."""
    return COMPUTE_URL_BASE + path


def collection_path(resource_path: str) -> str:
    """The collection a resource is created in: its path without the last segment (where ``insert`` is POSTed)."""
    return resource_path.rsplit("/", 1)[0]


def with_query(path: str, **params: str) -> str:
    """A path with a query string; ``/`` stays readable, as in resource names passed as query parameters."""
    return f"{path}?{urlencode(params, safe='/')}"


def message_body(message: proto.Message, explicit: Iterable[str] = ()) -> dict[str, Any]:
    """The JSON body of a proto-plus message exactly as the REST API takes it, and as gcloud sends it.

    JSON field names (``IPProtocol``, ``autoCreateSubnetworks``), enums as names, int64 as strings, unset fields and
    empty lists or maps left out. ``explicit`` names fields (dotted JSON paths, lists traversed element-wise, e.g.
    ``cluster.nodePools.initialNodeCount``) to send even at their zero value: proto3 fields without presence (most
    of container v1) cannot tell "set to false/0" from "unset", while gcloud sends some of them explicitly. The server
    reads an absent field and its zero value alike; sending them keeps the body byte-for-byte gcloud's.
    """
    cls = type(message)
    body = _strip_empty(
        cls.to_dict(
            message,
            use_integers_for_enums=False,
            preserving_proto_field_name=False,
            always_print_fields_with_no_presence=False,
        )
    )
    _sort_maps(body, cls.pb(message).DESCRIPTOR)
    explicit = tuple(explicit)
    if explicit:
        full = cls.to_dict(
            message,
            use_integers_for_enums=False,
            preserving_proto_field_name=False,
            always_print_fields_with_no_presence=True,
        )
        for dotted in explicit:
            _keep(full, body, dotted.split("."), dotted, cls.__name__)
    return body


def _sort_maps(body: dict[str, Any], descriptor: Any) -> None:
    """Put every map field's entries in key order: protobuf iterates maps in no fixed order, plans must not vary."""
    for fd in descriptor.fields:
        value = body.get(fd.json_name)
        if value is None or fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            body[fd.json_name] = dict(sorted(value.items()))
        elif isinstance(value, dict):
            _sort_maps(value, fd.message_type)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _sort_maps(item, fd.message_type)


def _strip_empty(value: Any) -> Any:
    """Drop empty lists and maps at every level (apitools, and so gcloud, never sends them)."""
    if isinstance(value, dict):
        stripped = {k: _strip_empty(v) for k, v in value.items()}
        return {k: v for k, v in stripped.items() if v not in ([], {})}
    if isinstance(value, list):
        return [_strip_empty(v) for v in value]
    return value


def _keep(full: dict[str, Any], body: dict[str, Any], parts: list[str], dotted: str, owner: str) -> None:
    key, rest = parts[0], parts[1:]
    if key not in full:
        # Also reached through a sub-message that was never set: there is nothing to send explicitly.
        raise ValueError(f"{owner}: explicit field {dotted!r} is not a field of the message, or its parent is unset")
    if not rest:
        body[key] = full[key]
        return
    inner = full[key]
    if isinstance(inner, list):
        items = body.setdefault(key, [{} for _ in inner])
        for inner_full, inner_body in zip(inner, items, strict=True):
            _keep(inner_full, inner_body, rest, dotted, owner)
    else:
        _keep(inner, body.setdefault(key, {}), rest, dotted, owner)


# ---------------------------------------------------------------------------------------------------------------------
# APIs without a google-cloud client: checked against the discovery documents google-api-python-client bundles.
# ---------------------------------------------------------------------------------------------------------------------
@functools.cache
def discovery_document(api: str, version: str) -> dict[str, Any]:
    """The discovery document of ``api`` ``version`` bundled with google-api-python-client (read, never fetched)."""
    spec = importlib.util.find_spec("googleapiclient")  # locate without importing the client library
    if spec is None or spec.origin is None:
        raise DiscoveryMismatchError("google-api-python-client is not installed: it bundles the discovery documents")
    path = Path(spec.origin).parent / "discovery_cache" / "documents" / f"{api}.{version}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def discovery_request(
    api: str,
    version: str,
    method: str,
    *,
    resource: str,
    params: Mapping[str, str],
    body: dict[str, Any] | None = None,
) -> ApiRequest:
    """Build an :class:`ApiRequest` for ``method`` (e.g. ``services.connections.create``) of a discovery-described API.

    The path comes from the method's own template; path parameters must match their patterns, query parameters must
    exist, and every body field must be a writable property of the method's request schema. Any mismatch raises
    :class:`DiscoveryMismatchError`, which is what a typed message would do for the google-cloud APIs.
    """
    doc = discovery_document(api, version)
    spec = _discovery_method(doc, method)
    declared = spec.get("parameters", {})
    for name in params:
        if name not in declared:
            raise DiscoveryMismatchError(f"{api}.{method}: unknown parameter {name!r}; known: {sorted(declared)}")
    missing = [n for n, p in declared.items() if p.get("required") and n not in params]
    if missing:
        raise DiscoveryMismatchError(f"{api}.{method}: missing required parameters {missing}")

    def expand(match: re.Match[str]) -> str:
        reserved, name = match.group(1) == "+", match.group(2)
        value = params[name]
        pattern = declared[name].get("pattern")
        if pattern and not re.fullmatch(pattern, value):
            raise DiscoveryMismatchError(f"{api}.{method}: {name}={value!r} does not match {pattern}")
        # {+name} is RFC 6570 reserved expansion: the value's slashes stay, as in "services/X/connections/-".
        return quote(value, safe="/-._~" if reserved else "-._~")

    path = "/" + re.sub(r"\{(\+?)([^}]+)\}", expand, spec["path"])
    query = {n: v for n, v in params.items() if declared[n]["location"] == "query"}
    if query:
        path = with_query(path, **query)
    request_schema = spec.get("request", {}).get("$ref")
    if body is not None:
        if request_schema is None:
            raise DiscoveryMismatchError(f"{api}.{method} takes no request body")
        _check_body(doc, request_schema, body, f"{api}.{method}")
    elif request_schema is not None:
        raise DiscoveryMismatchError(f"{api}.{method} needs a {request_schema} body")
    return ApiRequest(
        service=api,
        method=method,
        http_method=spec["httpMethod"],
        path=path,
        body=body,
        resource=resource,
    )


def _discovery_method(doc: dict[str, Any], method: str) -> dict[str, Any]:
    *resources, name = method.split(".")
    node: dict[str, Any] = doc
    for part in resources:
        node = node.get("resources", {}).get(part, {})
    found = node.get("methods", {}).get(name)
    if found is None:
        raise DiscoveryMismatchError(f"{doc['name']} {doc['version']} has no method {method!r}")
    return found


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
    "array": list,
    "object": dict,
}


def _check_body(doc: dict[str, Any], schema: str, body: Mapping[str, Any], where: str) -> None:
    properties = doc["schemas"][schema].get("properties", {})
    for key, value in body.items():
        prop = properties.get(key)
        if prop is None:
            raise DiscoveryMismatchError(f"{where}: {schema} has no field {key!r}; fields: {sorted(properties)}")
        if prop.get("readOnly"):
            raise DiscoveryMismatchError(f"{where}: {schema}.{key} is output only")
        if "$ref" in prop:
            _check_body(doc, prop["$ref"], value, where)
            continue
        expected = _JSON_TYPES.get(prop.get("type", ""), object)
        if not isinstance(value, expected):
            raise DiscoveryMismatchError(f"{where}: {schema}.{key} must be a JSON {prop['type']}, got {value!r}")
        item_type = _JSON_TYPES.get(prop.get("items", {}).get("type", ""), object)
        if isinstance(value, list) and not all(isinstance(item, item_type) for item in value):
            raise DiscoveryMismatchError(f"{where}: {schema}.{key} items must be {prop['items']['type']}s")
