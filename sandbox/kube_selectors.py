"""Label and field selectors as the Kubernetes API server parses and applies them.

Label selectors follow apimachinery's ``labels.Parse`` (``k8s.io/apimachinery/pkg/labels/selector.go``): comma-separated
requirements, each ``key`` (exists), ``!key`` (does not exist), ``key=value`` / ``key==value``, ``key!=value`` (also
true when the key is absent), ``key in (a,b)``, ``key notin (a,b)`` (also true when absent) or ``key>N`` / ``key<N``
(integers). Keys are qualified names with an optional DNS prefix, values valid label values; anything else is the
API server's 400 "unable to parse requirement". Field selectors take ``=``, ``==`` and ``!=`` on the field labels each
kind supports (every kind ``metadata.name`` and ``metadata.namespace``, more for pods, events, secrets, namespaces
and nodes); another field is the API server's 400 "field label not supported".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
KEY = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
VALUE = re.compile(rf"^({_NAME})?$")
_INTEGER = re.compile(r"^-?[0-9]+$")
# Field labels per plural beyond metadata.name and metadata.namespace (the registries' GetAttrs / field label
# conversion funcs in kubernetes/pkg/registry and pkg/apis/core/v1/conversion.go).
FIELD_LABELS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork",
         "status.phase", "status.podIP", "status.nominatedNodeName"}
    ),
    "events": frozenset(
        {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
         "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
         "reportingComponent", "source", "type"}
    ),
    "secrets": frozenset({"type"}),
    "namespaces": frozenset({"status.phase"}),
    "nodes": frozenset({"spec.unschedulable"}),
}  # fmt: skip


class SelectorError(ValueError):
    """A selector the API server would refuse (400 BadRequest, with this message)."""


@dataclass(frozen=True)
class Requirement:
    """One label requirement: a key, an operator and its values."""

    key: str
    op: str  # exists, !, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` meet the requirement, as ``labels.Requirement.Matches`` decides."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or value is None or not _INTEGER.match(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if self.op == "gt" else int(value) < bound


def _split(text: str) -> list[str]:
    """The requirements of ``text``: split on commas outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _key(key: str, whole: str) -> str:
    key = key.strip()
    if not KEY.match(key) or len(key.rpartition("/")[0]) > 253:
        raise SelectorError(
            f"unable to parse requirement: key: Invalid value: {key!r}: name part must consist of alphanumeric "
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character "
            f"(in {whole!r})"
        )
    return key


def _value(value: str, key: str) -> str:
    value = value.strip()
    if not VALUE.match(value):
        raise SelectorError(
            f"unable to parse requirement: values[0][{key}]: Invalid value: {value!r}: a valid label must be an "
            "empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )
    return value


_SET = re.compile(r"^\s*(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")


def _requirement(text: str) -> Requirement:
    stripped = text.strip()
    if not stripped:
        raise SelectorError(f"unable to parse requirement: found '', expected: identifier (in {text!r})")
    found = _SET.match(stripped)
    if found:
        key = _key(found["key"], stripped)
        values = tuple(_value(v, key) for v in found["values"].split(","))
        return Requirement(key, found["op"], values)
    if stripped.startswith("!"):
        return Requirement(_key(stripped[1:], stripped), "!")
    for token, op in (("==", "="), ("!=", "!="), ("=", "="), (">", "gt"), ("<", "lt")):
        if token in stripped:
            key, _, value = stripped.partition(token)
            key = _key(key, stripped)
            if op in ("gt", "lt"):
                if not _INTEGER.match(value.strip()):
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer "
                        f"(in {stripped!r})"
                    )
                return Requirement(key, op, (value.strip(),))
            if "=" in value or "!" in value:
                raise SelectorError(f"unable to parse requirement: found '{value.strip()}', expected: a value")
            return Requirement(key, op, (_value(value, key),))
    if " " in stripped or "(" in stripped or ")" in stripped:
        raise SelectorError(f"unable to parse requirement: found '{stripped}', expected: in, notin, =, ==, !=, gt, lt")
    return Requirement(_key(stripped, stripped), "exists")


def label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on an object's labels for ``text`` (empty: everything); :class:`SelectorError` when the API server
    would refuse it."""
    if not text.strip():
        return lambda _: True
    requirements = [_requirement(part) for part in _split(text)]
    return lambda labels: all(r.matches(labels) for r in requirements)


def _field_value(obj: Mapping[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _term(part: str, text: str, allowed: set[str]) -> tuple[str, bool, str]:
    """One field selector term: the field, whether it must equal (else differ from) the value, and the value."""
    token = next((t for t in ("==", "!=", "=") if t in part), None)
    if token is None:
        raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
    field, _, value = part.partition(token)
    if field.strip() not in allowed:
        raise SelectorError(f"field label not supported: {field.strip()}")
    return field.strip(), token != "!=", value.strip()


def field_selector(text: str, plural: str) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate on objects of ``plural`` for the field selector ``text``; :class:`SelectorError` for a field the
    kind does not support or a malformed term."""
    if not text.strip():
        return lambda _: True
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, frozenset())
    terms = [_term(part, text, allowed) for part in text.split(",")]
    return lambda obj: all((_field_value(obj, f) == v) == equal for f, equal, v in terms)
