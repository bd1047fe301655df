"""The trigger form's Params and the validator agree: the form never refuses a conf that validate accepts.

Airflow validates Params with JSON Schema, which takes 2.0 for an integer and matches a pattern with re.search (so
``name\\n`` passes ``^...$``); validate is stricter on exactly those points, by design, and never looser.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from nemo_rl_gke.dag_params import build_params
from nemo_rl_gke.run.conf_checks import conf_findings
from nemo_rl_gke.run.conf_schema import param_schema, spec_fields
from nemo_rl_gke.run.spec import default_conf

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


OPTIONAL = [
    "machine_type",
    "peering_range_address",
    "image_tag",
    "extra_overrides",
    "wandb_project",
    "export_bucket",
    "release_checkpoint_of_run",
]


@pytest.mark.parametrize("name", OPTIONAL)
def test_an_optional_field_left_empty_submits_and_means_the_default(name: str) -> None:
    # What the form sends for a blank field (null) and what an API caller may send ("" or []) all pass both checks.
    empty = [] if "array" in PARAMS[name].schema["type"] else ""
    for value in (None, empty):
        assert _param_accepts(name, value), value
        assert conf_findings({name: value}) == [], value
    assert build_params()[name].value is None  # resolve() above changed PARAMS[name].value
    from nemo_rl_gke.run.spec import RunSpec

    assert getattr(RunSpec.from_conf({name: None}), name) == getattr(RunSpec(), name)


def test_the_form_layout_names_only_real_fields_and_sections() -> None:
    from nemo_rl_gke.dag_params import FORM_LEADS, FORM_SECTION_ORDER, form_fields

    sections = {f.metadata["section"] for f in spec_fields()}
    assert set(FORM_SECTION_ORDER) == sections
    for section, leads in FORM_LEADS.items():
        assert {f.name for f in spec_fields() if f.metadata["section"] == section} >= set(leads), section
    assert sorted(f.name for f in form_fields()) == sorted(f.name for f in spec_fields())


def test_the_form_can_flag_a_bad_value_on_its_field() -> None:
    """Airflow's form marks a field itself only through its schema: a dropdown for an enum, a clamped number input
    for minimum/maximum, maxLength on a text box, and "required" on a typed field left blank. Every parameter gives
    it one of these, so a wrong value is caught at the field, not as a 400 after Trigger."""
    unbounded = []
    for name, param in PARAMS.items():
        schema = param.schema
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if "enum" in schema or "boolean" in kinds:
            continue
        if {"integer", "number"} & set(kinds):
            bounded = "maximum" in schema and ("minimum" in schema or "exclusiveMinimum" in schema)
        elif "array" in kinds:
            bounded = "maxItems" in schema and "maxLength" in schema.get("items", {})
        else:
            bounded = "maxLength" in schema
        if not bounded:
            unbounded.append(name)
    assert unbounded == []


def test_every_param_of_both_forms_is_checked_in_the_draft_07_dialect_and_still_refuses() -> None:
    # Airflow checks every Param at every task try; without the dialect jsonschema checks each schema against draft
    # 2020-12's metaschema, 4x slower. The dialect must not loosen a rule: a bad value is still refused.
    import jsonschema
    from airflow.sdk.definitions.param import ParamValidationError

    from nemo_rl_gke.dag_params import PARAM_SCHEMA_DIALECT, sweeper_params

    forms = {**build_params(), **{f"sweeper.{k}": v for k, v in sweeper_params().items()}}
    assert {name for name, p in forms.items() if p.schema.get("$schema") != PARAM_SCHEMA_DIALECT} == set()
    assert all(jsonschema.validators.validator_for(p.schema) is jsonschema.Draft7Validator for p in forms.values())
    with pytest.raises(ParamValidationError, match="less than the minimum"):
        build_params()["max_steps"].resolve(0)
    with pytest.raises(ParamValidationError, match="less than or equal to the minimum"):
        sweeper_params()["warm_ttl_hours"].resolve(0)


@pytest.mark.parametrize("recipe", ["gemma3-27b-gsm8k-v0.5.0", "qwen2.5-7b-gsm8k-v0.7.0", "local-cpu-gsm8k"])
def test_picking_a_recipe_in_the_form_brings_its_own_defaults_so_the_forms_conf_validates(recipe: str) -> None:
    from nemo_rl_gke.preflight.offline import check_conf
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.recipes import load_recipe

    conf = {name: param.value for name, param in build_params().items()}
    assert conf["dtensor_tp"] is None and conf["vllm_tp"] is None  # the form starts them empty
    conf["recipe"] = recipe
    if recipe == "local-cpu-gsm8k":
        conf.update(worker_replicas=1, gpu_pool_max_nodes=1, colocated=True)
    spec, findings = check_conf(conf, Deployment(gcp_project=conf["project"]))
    assert findings == [] and spec is not None, findings
    defaults = load_recipe(recipe).conf_defaults
    assert (spec.dtensor_tp, spec.vllm_tp) == (defaults["dtensor_tp"], defaults["vllm_tp"])


def test_the_tutorials_tensor_parallelism_set_by_hand_is_still_refused_for_qwens_28_heads() -> None:
    from nemo_rl_gke.preflight.offline import check_conf
    from nemo_rl_gke.run.deployment import Deployment

    conf = {**{name: param.value for name, param in build_params().items()}, "recipe": "qwen2.5-7b-gsm8k-v0.7.0"}
    _, findings = check_conf({**conf, "dtensor_tp": 8}, Deployment(gcp_project=conf["project"]))
    assert [f.rule_id for f in findings] == ["nemo.tp-divides-heads"] and findings[0].params[0] == "dtensor_tp"
