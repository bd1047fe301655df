"""The DAG's trigger-form Params, generated from the RunSpec fields so the form and the validator never drift."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from nemo_rl_gke.spec import default_conf, spec_fields


def build_params(overrides: dict[str, Any] | None = None) -> dict[str, Param]:
    """One Param per RunSpec field, in form order, with type, enum, range, title, description and section.

    ``overrides`` replaces some defaults (a schedule's partial conf).
    """
    defaults = {**default_conf(), **(overrides or {})}
    params: dict[str, Param] = {}
    for f in spec_fields():
        schema = dict(f.metadata["schema"])
        description = schema.pop("description")
        params[f.name] = Param(defaults[f.name], description=description, section=f.metadata["section"], **schema)
    return params
