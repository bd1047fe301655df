"""Values read from a checkpoint: looked up, compared, measured and echoed safely (never trusted)."""

from __future__ import annotations

import json
from typing import Any

from .limits import MAX_JSON_DEPTH, MAX_SHOWN

MISSING = object()


def lookup(config: Any, dotted: str) -> Any:
    """config["a"]["b"] for "a.b"; list items by index; MISSING when any part is absent."""
    node = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def same(have: Any, want: Any) -> bool:
    """Equality without Python's True == 1, but with 20 == 20.0 (JSON and YAML type numbers differently)."""
    if isinstance(have, bool) or isinstance(want, bool):
        return type(have) is type(want) and have == want
    return have == want


def json_depth(value: Any) -> int:
    """How deeply JSON containers nest (a scalar is 0), counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                pending.extend((child, level + 1) for child in children)
    return deepest


def show(value: Any) -> str:
    """JSON for a value read from the checkpoint, cut to MAX_SHOWN characters; never raises."""
    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):  # an int past Python's str limit, a date key, deep nesting
        text = f"<a {type(value).__name__}>"
    return clip(text)


def clip(text: str) -> str:
    """A string from the checkpoint, cut to MAX_SHOWN characters so a crafted name cannot flood the report."""
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"


def one_line(exc: BaseException) -> str:
    return clip(" ".join(str(exc).split()) or type(exc).__name__)
