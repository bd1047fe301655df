"""Comparing what exists with what the conf asks for: references, dotted JSON paths and the drift diff."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def message_dict(message: Any) -> dict[str, Any]:
    """A google-cloud message as its REST JSON (camelCase names, enum names), the shape every ``get`` returns."""
    return type(message).to_dict(
        message,
        use_integers_for_enums=False,
        preserving_proto_field_name=False,
        always_print_fields_with_no_presence=False,
    )


def normalize_ref(value: str) -> str:
    """A resource reference without its host and API version, so the three spellings compare equal.

    ``https://www.googleapis.com/compute/v1/projects/p/global/networks/n``,
    ``https://compute.googleapis.com/compute/v1/projects/p/global/networks/n`` and
    ``projects/p/global/networks/n`` all become the last; a bare name stays a bare name.
    """
    ref = re.sub(r"^[a-z]+://[^/]+", "", value.strip()).lstrip("/")
    ref = re.sub(r"^(?:compute/)?(?:v1|beta|alpha)/", "", ref)
    return ref


def after_project(ref: str) -> str:
    """``projects/<id or number>/rest`` -> ``rest``: what does not depend on how the project is named."""
    return re.sub(r"^projects/[^/]+/", "", ref)


def same_ref(expected: str, actual: str) -> bool:
    """Whether two references name the same resource: whole paths compared when both have them, else the names.

    GKE and the pool's additional networks take bare names in the same project, while Compute answers with URLs.
    """
    left, right = normalize_ref(expected), normalize_ref(actual)
    if "/" in left and "/" in right:
        return left == right
    return left.rsplit("/", 1)[-1] == right.rsplit("/", 1)[-1]


def last_part(value: Any) -> Any:
    return normalize_ref(value).rsplit("/", 1)[-1] if isinstance(value, str) else value


def dig(data: dict[str, Any] | None, path: str, default: Any = None) -> Any:
    """The value at a dotted JSON path, or ``default`` when any part is missing."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, default=str)


def as_int(value: Any) -> Any:
    # JSON carries int64 as strings ("capacityGib": "18000"); both spellings mean the same number.
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


@dataclass(frozen=True)
class Check:
    """One field drift compares: its dotted JSON path, the API's value when absent, and how to normalise it.

    ``ref`` compares resource references with :func:`same_ref`.
    """

    path: str
    default: Any = None
    norm: Callable[[Any], Any] | None = None
    ref: bool = False


def diff(expected_body: dict[str, Any], actual: dict[str, Any], checks: Sequence[Check]) -> list[str]:
    """``"field: expected X, found Y"`` for every checked field whose actual value differs from the request body's."""
    lines: list[str] = []
    for check in checks:
        expected = dig(expected_body, check.path, check.default)
        if expected is None:
            continue  # the conf does not set it: any value will do
        found = dig(actual, check.path, check.default)
        if check.ref:
            same = isinstance(found, str) and same_ref(expected, found)
        else:
            if check.norm is not None:
                expected, found = check.norm(expected), check.norm(found)
            same = expected == found
        if not same:
            lines.append(f"{check.path}: expected {show(expected)}, found {show(found)}")
    return lines
