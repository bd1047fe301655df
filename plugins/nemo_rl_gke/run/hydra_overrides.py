"""Hydra override text: one override parsed by Hydra's own parser (sweeps, config groups and unrepresentable
values refused, with the reason and the fix), and a conf value escaped so that NeMo RL reads back exactly its text
(``${...}`` never resolves; ``true``, ``null`` or ``1e3`` stay strings).

Hydra is imported only when the first override is parsed (the DAG file parses without it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

# Longer overrides are refused before Hydra's (recursive, pure-Python ANTLR) parser sees them.
OVERRIDE_MAX_CHARS = 4096
# Hydra's OverrideType names -> the prefix an override is written with.
OPS = {"CHANGE": "", "ADD": "+", "FORCE_ADD": "++", "DEL": "~"}
KINDS = {"": "change", "+": "add", "++": "force-add", "~": "delete"}

# Values left bare only if they match this *and* Hydra's own parser reads them back as the same string.
_BARE = re.compile(r"[A-Za-z0-9_./:@+\-]+")
# OmegaConf resolves `${` in any string; k backslashes before it become 2k+1 so OmegaConf yields k and a literal `${`.
_INTERPOLATION = re.compile(r"(?<!\\)(\\*)\$\{")
# Inside Hydra's '...' a backslash run is literal except before a quote or the closing quote: those are doubled.
_QUOTE_OR_END = re.compile(r"(?<!\\)(\\*)('|\Z)")
# NUL cannot be carried by argv, and lone surrogates cannot be encoded as UTF-8 for the job submission.
_UNREPRESENTABLE = re.compile("[\x00\ud800-\udfff]")


class RecipeError(ValueError):
    """A recipe file is missing, malformed or refers to something that does not exist."""


class OverrideError(RecipeError):
    """An override Hydra refuses, or one this package refuses (sweep, config group, unrepresentable value)."""

    def __init__(self, text: str, problem: str, fix: str) -> None:
        self.text = text
        self.problem = problem
        self.fix = fix
        super().__init__(f"{clip(text)}: {problem}")


@dataclass(frozen=True)
class Override:
    """One Hydra override as Hydra 1.3's own parser reads it.

    ``op`` is ``""`` (``key=v`` changes an existing key), ``"+"`` (adds a missing one), ``"++"`` (either) or
    ``"~"`` (deletes); ``value`` is the typed value Hydra hands OmegaConf (``None`` for a bare ``~key``).
    """

    op: str
    key: str
    value: Any
    text: str
    # Hydra's own parsed object, applied as is by :meth:`Recipe.apply` (not part of equality).
    hydra: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Override:
        """Parse one override with Hydra's parser; raises :class:`OverrideError` when it is refused."""
        return parse_override(text)

    @property
    def kind(self) -> str:
        """Hydra's override type: change, add, force-add or delete."""
        return KINDS[self.op]

    def interpolations(self) -> list[str]:
        """Every string in the value (dict keys included) that OmegaConf would treat as an interpolation."""
        return [s for s in _strings(self.value) if "${" in s]

    def touches(self, key: str) -> bool:
        """Whether applying this override can change ``key``: the same key, an ancestor, or a key below it."""
        return self.key == key or key.startswith(self.key + ".") or self.key.startswith(key + ".")


def clip(text: Any, limit: int = 120) -> str:
    """``text`` as a string of at most ``limit`` characters, for findings and messages."""
    if not isinstance(text, str):
        try:
            text = repr(text)
        except ValueError:  # an int with more digits than int -> str allows
            text = f"<{type(text).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def hydra_value(value: Any) -> str:
    """Render a conf value as a Hydra override value that NeMo RL reads back exactly (the ``hydra`` filter).

    Booleans, ``None``, integers and finite floats are written as Hydra literals. A string stays bare only when
    Hydra's parser reads it back as the same string; otherwise it is single-quoted, with ``${`` escaped for
    OmegaConf (which resolves interpolations even in quoted values) and backslashes before a quote or at the end
    escaped for Hydra. Every result is parsed back by Hydra before it is returned. Raises :class:`RecipeError`
    for a value that cannot be passed literally (NUL, lone surrogates, NaN, other types).
    """
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise RecipeError(f"a {type(value).__name__} cannot be passed as a Hydra override value")
    return _hydra_value(value)


@lru_cache(maxsize=4096, typed=True)
def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, int):
        try:
            text = str(value)
        except ValueError as exc:  # more digits than int -> str allows
            raise RecipeError("an integer with more than 4300 digits cannot be a Hydra override value") from exc
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise RecipeError(f"{value} is not a finite number")
        text = repr(value)
    else:
        text = _quote(value)
    parsed = _parse(f"k={text}")
    if isinstance(parsed, OverrideError):
        raise RecipeError(f"{clip(value)} cannot be passed to Hydra: {parsed.problem}")
    expected = literal_for_omegaconf(value) if isinstance(value, str) else value
    # The proof, for this value: Hydra reads back exactly what OmegaConf must receive, with the same type.
    if type(parsed.value) is not type(expected) or parsed.value != expected:
        raise RecipeError(f"{clip(value)} cannot be passed to Hydra literally")
    return text


def _quote(text: str) -> str:
    if _UNREPRESENTABLE.search(text):
        raise RecipeError(f"{clip(repr(text))} holds NUL or an unpaired surrogate, which a command line cannot carry")
    if _BARE.fullmatch(text):
        parsed = _parse(f"k={text}")
        if isinstance(parsed, Override) and isinstance(parsed.value, str) and parsed.value == text:
            return text
    escaped = literal_for_omegaconf(text)
    return "'" + _QUOTE_OR_END.sub(lambda m: m[1] * 2 + ("\\'" if m[2] else ""), escaped) + "'"


def literal_for_omegaconf(text: str) -> str:
    """The string OmegaConf must be given to produce exactly ``text`` when it resolves the config.

    OmegaConf treats any string containing ``${`` as an interpolation: ``\\${`` is a literal ``${`` and 2k+1
    backslashes before ``${`` become k backslashes and a literal ``${``; every other backslash is literal.
    """
    return _INTERPOLATION.sub(lambda m: m[1] * 2 + "\\${", text)


def parse_override(text: str) -> Override:
    """Parse one override with Hydra's own parser; raises :class:`OverrideError` with the reason and the fix.

    Refused besides what Hydra's grammar refuses: sweeps (``a,b``, ``choice()``, ``range()``, ``glob()``...),
    which NeMo RL cannot apply; config group and package overrides (``group/x=...``, ``key@pkg=...``), which NeMo
    RL has no groups for; an empty key; NUL and unpaired surrogates; more than :data:`OVERRIDE_MAX_CHARS`.
    """
    parsed = _parse(text)
    if isinstance(parsed, OverrideError):
        raise parsed
    return parsed


_QUOTE_FIX = (
    "write key=value (+key=value to add, ~key to delete) and put a value with spaces, commas, '=', '#', "
    "brackets or non-ASCII characters in single quotes"
)


def _parse(text: Any) -> Override | OverrideError:
    if not isinstance(text, str):
        return OverrideError(clip(text), "is not a string", "write key=value")
    return _parse_str(text)


@lru_cache(maxsize=8192)
def _parse_str(text: str) -> Override | OverrideError:
    if len(text) > OVERRIDE_MAX_CHARS:
        return OverrideError(text, f"is longer than {OVERRIDE_MAX_CHARS} characters", "shorten it")
    if _UNREPRESENTABLE.search(text):
        return OverrideError(text, "holds NUL or an unpaired surrogate, which a command line cannot carry", "remove it")
    try:
        (hydra,) = _parser().parse_overrides([text])
        value = hydra.value()
    except Exception as exc:  # third-party parser on untrusted text: any failure is a refusal
        return OverrideError(text, f"is refused by Hydra's override parser ({_hydra_message(exc)})", _QUOTE_FIX)
    key = hydra.key_or_group
    if hydra.package is not None or "/" in key:
        return OverrideError(
            text,
            "is a config group or package override (group/option or key@package), and NeMo RL's configs have no "
            "groups: Hydra refuses it when the job starts",
            "write a plain dotted key: key=value",
        )
    if not key:
        return OverrideError(text, "has no key", "write key=value")
    if hydra.is_sweep_override():
        return OverrideError(
            text,
            "is a sweep (an unquoted ',' or choice/range/interval/glob), which NeMo RL cannot apply: one job runs "
            "one value",
            "give one value; quote a string with a comma ('a,b'), or write a list as [a,b]",
        )
    return Override(OPS[hydra.type.name], key, value, text, hydra)


def _hydra_message(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "hydra.cc/docs" not in line]
    lines = [line for line in lines if set(line) != {"^"}]
    return clip("; ".join(lines) or type(exc).__name__, 160)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


@cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()
