"""How a resource says this package made it: a label where the API has labels, the description marker otherwise."""

from __future__ import annotations

from typing import Any

from nemo_rl_gke.spec import OWNER_LABEL_KEY, OWNER_LABEL_VALUE

OWNER_MARKER = f"{OWNER_LABEL_KEY}={OWNER_LABEL_VALUE}"


def has_owner_label(labels: Any) -> bool:
    """Whether a resource's labels carry the ownership marker."""
    return isinstance(labels, dict) and labels.get(OWNER_LABEL_KEY) == OWNER_LABEL_VALUE


def has_owner_description(description: Any) -> bool:
    """Whether a resource's description carries the ownership marker (Compute objects without labels)."""
    return isinstance(description, str) and OWNER_MARKER in description
