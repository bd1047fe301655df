"""The conf's shape, checked before a RunSpec exists: unknown keys (credential-looking ones never echoed) and each
value against its parameter's JSON schema, shared with the Airflow Params; the JSON-to-field coercion.

This module is pure: it is imported while the DAG file is parsed, so it must stay cheap (no google/kubernetes/ray).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from nemo_rl_gke.run.conf_schema import FIELDS, NAME_MAX, PATTERN_WORDS
from nemo_rl_gke.run.findings import CREDENTIAL_VALUE, REDACTED, Finding, looks_like_secret, shown

# Former parameters that the deployment now decides: a conf that sets one is refused, not silently ignored.
DEPLOYMENT_SETTINGS = {
    "ray_dashboard_url": "where the Ray job, with the HF and W&B tokens in its environment, is submitted",
}
# Words that mark a conf key as carrying a credential: the value of such an unknown key is never echoed. Known
# parameters are exempt (hf_conn_id names a connection, it holds no secret), hence the lookahead.
_SECRET_WORDS = (
    "token|secret|passw|pwd|pass|api.?key|key|auth|credential|cred|cookie|session|bearer|private|signature|cert|jwt"
    "|ssh|hf|wandb"
)
SECRET_KEY = re.compile(
    r"^(?!(?-i:" + "|".join(map(re.escape, FIELDS)) + r")\Z).*?(?:" + _SECRET_WORDS + ")", re.IGNORECASE | re.DOTALL
)
# An unknown key's value is shown only when it is a short scalar: anything longer may be a pasted file or token.
UNKNOWN_VALUE_MAX = 40


def is_secret_key(key: object) -> bool:
    """Whether ``key`` is an unknown conf key that looks like it carries a credential (its value is never shown)."""
    return isinstance(key, str) and bool(SECRET_KEY.search(key))


def conf_findings(conf: Any) -> list[Finding]:
    """Every unknown key and every value that breaks its parameter's schema, in conf order.

    Total: any JSON-like input (any types, nesting, huge integers, NaN, very long strings, non-string keys) gives
    findings, never an exception. Stricter than JSON Schema where that matters later: an integer is an ``int`` (not
    2.0, not true), a number is finite, a string is printable and matches its pattern whole.
    """
    if not isinstance(conf, Mapping):
        return [
            Finding(
                "conf.not-an-object",
                ("conf",),
                f"<{type(conf).__name__}>",
                "the run conf must be a JSON object of parameter names to values",
                'pass e.g. {"mode": "plan"}; `python -m nemo_rl_gke params` lists the parameters',
            )
        ]
    findings: list[Finding] = []
    for key, value in conf.items():
        if isinstance(key, str) and key in FIELDS:
            finding = _field_finding(key, value)
        else:
            finding = _unknown_key_finding(key, value)
        if finding is not None:
            findings.append(finding)
    return findings


def _unknown_key_finding(key: object, value: Any) -> Finding | None:
    if not isinstance(key, str):
        return Finding(
            "conf.key-type",
            (f"<{type(key).__name__} key>",),
            "<not shown>",
            "conf keys are parameter names (strings)",
            "remove it; valid parameters are listed by `python -m nemo_rl_gke params`",
        )
    param = "<redacted key>" if looks_like_secret(key) else key
    if key in DEPLOYMENT_SETTINGS:
        if value in (None, ""):
            return None  # the old "not set" value asks for nothing
        return Finding(
            "conf.deployment-setting",
            (param,),
            "<not shown>",
            f"{key} is no longer a run parameter: {DEPLOYMENT_SETTINGS[key]} is decided by the deployment, never by "
            "the conf",
            f"remove it; an Airflow admin sets [nemo_rl_gke] {key} (AIRFLOW__NEMO_RL_GKE__{key.upper()}) if needed",
        )
    if is_secret_key(key):
        # Never echo it: findings go to the task log and XCom.
        return Finding(
            "conf.secret-in-conf",
            (param,),
            REDACTED,
            "secrets are not accepted in the conf: a run's conf is stored with the run and shown in the UI",
            "remove it and put the token in the password of an Airflow connection (or the secrets backend) that the "
            "deployment allows for it ([nemo_rl_gke] hf_conn_ids / wandb_conn_ids)",
        )
    close = difflib.get_close_matches(key, FIELDS, n=1) if len(key) <= NAME_MAX else []
    hint = f"did you mean '{close[0]}'? " if close else ""
    return Finding(
        "conf.unknown-key",
        (param,),
        _unknown_value(value),
        "unknown parameter (Airflow accepts unknown conf keys silently, this DAG does not)",
        f"{hint}remove it; valid parameters are listed by `python -m nemo_rl_gke params`",
    )


def _unknown_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= UNKNOWN_VALUE_MAX and not looks_like_secret(value):
        return value
    return f"<not shown: {type(value).__name__}>"


def _field_finding(key: str, value: Any) -> Finding | None:
    schema = FIELDS[key].metadata["schema"]
    problem = _value_problem(schema, value)
    if problem is not None:
        keyword, message = problem
        if keyword == "secret":
            return Finding(
                "conf.secret-in-conf",
                (key,),
                REDACTED,
                message,
                "remove it; tokens belong in the password of an Airflow connection the deployment allows",
            )
        # An array item's fix is the item's own schema.
        item = message.startswith("item ")
        fix = f"each item: {schema_fix(schema.get('items', {}))}" if item else schema_fix(schema)
        return Finding(f"conf.{keyword}", (key,), value, message, fix)
    return None


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type", "string")
    return list(kind) if isinstance(kind, (list, tuple)) else [kind]


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return type(value) is int  # JSON Schema would take 2.0 and Python's True; the templates would not
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return isinstance(value, int) or math.isfinite(value)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, (list, tuple))
    return False


def _type_message(kinds: list[str], value: Any) -> str:
    expected = " or ".join(repr(k) for k in kinds)
    if "integer" in kinds and isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return f"{shown(value)} is a decimal number, not of type {expected} (write it without a decimal point)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{shown(value)} is not a finite number, not of type {expected}"
    return f"{shown(value)} is not of type {expected}"


def _value_problem(schema: Mapping[str, Any], value: Any) -> tuple[str, str] | None:
    """The first way ``value`` breaks ``schema``, as (JSON-schema keyword, message), or None."""
    kinds = _types(schema)
    if not any(_type_ok(kind, value) for kind in kinds):
        return "type", _type_message(kinds, value)
    if value is None:
        return None
    if "enum" in schema and value not in schema["enum"]:
        return "enum", f"{shown(value)} is not one of {shown(list(schema['enum']))}"
    if isinstance(value, str):
        return _string_problem(schema, value)
    if isinstance(value, (list, tuple)):
        return _array_problem(schema, value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_problem(schema, value)
    return None


def _number_problem(schema: Mapping[str, Any], value: float) -> tuple[str, str] | None:
    if "minimum" in schema and value < schema["minimum"]:
        return "minimum", f"{shown(value)} is less than the minimum of {schema['minimum']}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return (
            "exclusiveMinimum",
            f"{shown(value)} is less than or equal to the minimum of {schema['exclusiveMinimum']}",
        )
    if "maximum" in schema and value > schema["maximum"]:
        return "maximum", f"{shown(value)} is greater than the maximum of {schema['maximum']}"
    return None


def _string_problem(schema: Mapping[str, Any], value: str) -> tuple[str, str] | None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return "maxLength", f"{shown(value)} is longer than {schema['maxLength']} characters ({len(value)})"
    if not value.isprintable():
        # Newlines, tabs, NULs, lone surrogates, zero-width marks: a name check that allows them lets them through.
        return "printable", f"{shown(value)} contains a control, separator or unpaired surrogate character"
    if CREDENTIAL_VALUE.search(value):
        return "secret", "this looks like a token or key; secrets are never accepted in the conf"
    if "minLength" in schema and len(value) < schema["minLength"]:
        return "minLength", f"{shown(value)} is shorter than {schema['minLength']} characters"
    if "pattern" in schema and not _pattern(schema["pattern"]).fullmatch(value):
        return "pattern", f"{shown(value)} does not match {PATTERN_WORDS.get(schema['pattern'], schema['pattern'])}"
    return None


def _array_problem(schema: Mapping[str, Any], value: list[Any] | tuple[Any, ...]) -> tuple[str, str] | None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return "maxItems", f"the list has {len(value)} items, more than {schema['maxItems']}"
    if "minItems" in schema and len(value) < schema["minItems"]:
        return "minItems", f"{shown(value)} has fewer than {schema['minItems']} items"
    for n, item in enumerate(value):
        problem = _value_problem(schema.get("items", {"type": "string"}), item)
        if problem is not None:
            keyword, message = problem
            return keyword, f"item {n}: {message}"
    return None


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str]:
    # fullmatch, not match: `$` also matches before a trailing newline, so "name\n" would pass a `^...$` check.
    return re.compile(pattern)


def schema_fix(schema: Mapping[str, Any]) -> str:
    """How to write a value that fits ``schema``, for a finding's fix."""
    if "enum" in schema:
        return "use one of " + ", ".join(str(v) for v in schema["enum"])
    kinds = [k for k in _types(schema) if k != "null"] if "type" in schema else ["string"]
    parts = [f"give a JSON {' or '.join(kinds)}"]
    if "integer" in kinds:
        parts.append("written without a decimal point")
    if "array" in kinds:
        parts.append(f"of {schema.get('minItems', 0)}-{schema.get('maxItems', 'any')} strings")
    for key, text in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
    ):
        if key in schema:
            parts.append(f"{text} {schema[key]}")
    if "string" in kinds:
        parts.append("printable characters only")
    if schema.get("pattern") in PATTERN_WORDS:
        parts.append(f"in one of the forms {PATTERN_WORDS[schema['pattern']]}")
    elif "pattern" in schema:
        parts.append(f"matching {schema['pattern']} as a whole")
    return ", ".join(parts)


def _coerce(conf: Mapping[str, Any]) -> dict[str, Any]:
    """JSON values to field types: arrays become tuples (hashable, frozen), integers in number fields floats, and a
    null (an optional field left empty in the form) the field's default."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if value is None:
            continue
        kinds = _types(FIELDS[key].metadata["schema"])
        out[key] = tuple(value) if "array" in kinds else float(value) if "number" in kinds else value
    return out
