"""Request checks: bodies parsed into the real message types with unknown fields rejected, and the APIs' name rules.

A misspelt field answers 400 INVALID_ARGUMENT with Google's wording ("Invalid JSON payload received. Unknown name
..."). The APIs without a google-cloud client (Service Networking) are checked against the discovery document
google-api-python-client bundles, property by property.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import uuid
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from sandbox.errors import invalid

# FACTS §4 "Names", and the APIs' own documentation.
COMPUTE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
GKE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
LUSTRE_INSTANCE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
LUSTRE_FILESYSTEM = re.compile(r"^[A-Za-z0-9]{1,8}$")
PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
MAX_LABELS = 64
_UNKNOWN_FIELD = re.compile(r'has no field named "([^"]+)" at "([^"]*)"')


def parse_message(message_type: Any, body: dict[str, Any] | str, where: str) -> Any:
    """Parse a JSON body into a proto-plus message, rejecting unknown fields and wrong types with a 400."""
    text = body if isinstance(body, str) else json.dumps(body)
    try:
        return message_type.from_json(text, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        first = str(exc).splitlines()[0]
        unknown = _UNKNOWN_FIELD.search(first)
        if unknown:
            field, at = unknown.groups()
            raise invalid(
                f"Invalid JSON payload received. Unknown name \"{field}\" at '{_at(where, at)}': Cannot find field."
            ) from exc
        raise invalid(f"Invalid value at '{where}': {first}") from exc


def _at(where: str, at: str) -> str:
    # ParseError says where by message type path ("Network.routingConfig"); Google says it by field path.
    parts = at.split(".")[1:]
    return ".".join([where, *parts])


def message_dict(message: Any) -> dict[str, Any]:
    """A message as camelCase JSON with only the fields that were set (enums by name, int64 as strings)."""
    return type(message).to_dict(
        message,
        use_integers_for_enums=False,
        always_print_fields_with_no_presence=False,
        preserving_proto_field_name=False,
    )


def check_name(value: str, rule: re.Pattern[str], field: str) -> None:
    """400 unless ``value`` matches the API's name rule for ``field``."""
    if not rule.match(value or ""):
        raise invalid(
            f"Invalid value for field '{field}': '{value}'. Must be a match of regex '{rule.pattern}'",
        )


def check_request_id(value: str | None) -> str | None:
    """400 unless a ``requestId`` is a UUID other than the zero UUID (compute and Lustre both require it)."""
    if value is None:
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.int == 0:
        raise invalid(f"Invalid value for field 'requestId': '{value}'. Must be a valid UUID other than the zero UUID.")
    return value


def check_labels(labels: dict[str, str], field: str) -> None:
    """400 unless the labels follow Google's label rules (lowercase keys and values, at most 64)."""
    if len(labels) > MAX_LABELS:
        raise invalid(f"Invalid value for field '{field}': at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise invalid(
                f"Invalid value for field '{field}': label {key}={value!r} must be lowercase letters, digits, "
                "'_' or '-', up to 63 characters, the key starting with a letter"
            )


# ---------------------------------------------------------------------------------------------------------------------
# Discovery-described APIs
# ---------------------------------------------------------------------------------------------------------------------
@functools.cache
def discovery_document(api: str, version: str) -> dict[str, Any]:
    """The discovery document google-api-python-client bundles for ``api`` ``version`` (read from disk)."""
    spec = importlib.util.find_spec("googleapiclient")
    if spec is None or spec.origin is None:
        raise RuntimeError("google-api-python-client is not installed: it bundles the discovery documents")
    path = Path(spec.origin).parent / "discovery_cache" / "documents" / f"{api}.{version}.json"
    return json.loads(path.read_text(encoding="utf-8"))


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "boolean": bool,
    "integer": (int, str),
    "number": (int, float),
    "array": list,
    "object": dict,
}


def check_discovery_body(api: str, version: str, schema: str, body: dict[str, Any], where: str) -> None:
    """400 for a field the discovery schema does not have, or a value of the wrong JSON type."""
    doc = discovery_document(api, version)
    properties = doc["schemas"][schema].get("properties", {})
    for key, value in body.items():
        prop = properties.get(key)
        if prop is None:
            raise invalid(f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field.")
        if "$ref" in prop:
            if not isinstance(value, dict):
                raise invalid(f"Invalid value at '{where}.{key}': expected an object")
            check_discovery_body(api, version, prop["$ref"], value, f"{where}.{key}")
            continue
        expected = _JSON_TYPES.get(prop.get("type", ""), object)
        if not isinstance(value, expected) or (prop.get("type") != "boolean" and isinstance(value, bool)):
            raise invalid(f"Invalid value at '{where}.{key}' ({prop.get('type')}): {json.dumps(value)}")
        if isinstance(value, list):
            item_type = _JSON_TYPES.get(prop.get("items", {}).get("type", ""), object)
            bad = [item for item in value if not isinstance(item, item_type)]
            if bad:
                raise invalid(f"Invalid value at '{where}.{key}[]': {json.dumps(bad[0])}")
