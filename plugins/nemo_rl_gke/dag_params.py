"""The DAG's trigger-form Params, generated from the RunSpec fields so the form and the validator never drift."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import Param

from nemo_rl_gke.paths import INCLUDE_DIR
from nemo_rl_gke.spec import default_conf, spec_fields


def build_params(overrides: dict[str, Any] | None = None) -> dict[str, Param]:
    """One Param per RunSpec field, in form order, with type, enum, range, title, description and section.

    ``overrides`` replaces defaults (e.g. a nightly DAG's conf); its keys must be RunSpec fields.
    """
    defaults = default_conf()
    unknown = set(overrides or {}) - set(defaults)
    if unknown:
        raise ValueError(f"default overrides name unknown parameters: {sorted(unknown)}")
    defaults.update(overrides or {})
    params: dict[str, Param] = {}
    for f in spec_fields():
        schema = dict(f.metadata["schema"])
        description = schema.pop("description")
        params[f.name] = Param(defaults[f.name], description=description, section=f.metadata["section"], **schema)
    return params


def conf_file(name: str) -> dict[str, Any]:
    """A conf shipped in include/conf (e.g. the nightly DAG's defaults); a local file read, no network."""
    return json.loads((INCLUDE_DIR / "conf" / name).read_text())
