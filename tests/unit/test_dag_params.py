"""The trigger form's Params and the validator agree: the form never refuses a conf that validate accepts.

Airflow validates Params with JSON Schema, which takes 2.0 for an integer and matches a pattern with re.search (so
``name\\n`` passes ``^...$``); validate is stricter on exactly those points, by design, and never looser.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from nemo_rl_gke.dag_params import build_params
from nemo_rl_gke.spec import conf_findings, default_conf, param_schema, spec_fields

PARAMS = build_params()
PROBES: list[Any] = [
    0,
    1,
    -1,
    2,
    8,
    600,
    10**9,
    2**63,
    2.0,
    0.5,
    1e-300,
    1e308,
    math.nan,
    math.inf,
    True,
    False,
    None,
    "",
    "a",
    "nemo-rl",
    "nemo-rl\n",
    "Ab_9",
    "v0.5.0",
    "n2-highmem-80",
    "/data/x",
    "x" * 300,
    [],
    ["a=b"],
    [f"10.{n}.0.0/24" for n in range(8)],
]


def _param_accepts(name: str, value: Any) -> bool:
    try:
        PARAMS[name].resolve(value)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name", [f.name for f in spec_fields()])
def test_the_form_accepts_whatever_validate_accepts(name: str) -> None:
    accepted = [value for value in [default_conf()[name], *PROBES] if not conf_findings({name: value})]
    assert accepted, f"no probe fits {name}; add one"
    refused_by_form = [value for value in accepted if not _param_accepts(name, value)]
    assert refused_by_form == []


def test_validate_is_stricter_than_the_form_where_json_schema_is_loose() -> None:
    for name, value in [("worker_replicas", 2.0), ("cluster_name", "nemo-rl\n"), ("max_steps", 10.0)]:
        assert _param_accepts(name, value), "Airflow's JSON Schema takes it"
        assert conf_findings({name: value}), "validate does not"
    assert PARAMS["job_timeout_s"].schema["maximum"] == param_schema("job_timeout_s")["maximum"] == 14 * 86_400
