"""The DAG's trigger-form Params, generated from the RunSpec fields so the form and the validator never drift.

The form's layout is decided here, not in the RunSpec: Airflow's trigger form shows one accordion per ``section`` in
the order the Params come, and opens only the section named ``Run Parameters`` (FACTS §11). So the run's own section
is shown under that name and comes first, the sections a person changes most follow it, and each section opens with
its most-changed fields; the rest keep their RunSpec order, so a parameter added to the RunSpec shows up without an
edit here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow.sdk import Param

from nemo_rl_gke.run import conf_schema as s
from nemo_rl_gke.run.conf_schema import default_conf, param_schema, recipe_defaulted, spec_fields

# The one section Airflow 3.3's trigger form opens when it loads (its flexibleFormDefaultSection, not translated).
FORM_OPEN_SECTION = "Run Parameters"
# The form's name of a RunSpec section, where it differs.
FORM_SECTION_TITLES: dict[str, str] = {s.SECTION_RUN: FORM_OPEN_SECTION}
# Sections in the order a person goes through them: what and where first, tuning and timeouts last.
FORM_SECTION_ORDER: tuple[str, ...] = (
    s.SECTION_RUN,
    s.SECTION_LOCATION,
    s.SECTION_GPU,
    s.SECTION_TRAINING,
    s.SECTION_LOGGING,
    s.SECTION_TEARDOWN,
    s.SECTION_MODEL,
    s.SECTION_STORAGE,
    s.SECTION_CLUSTER,
    s.SECTION_NETWORK,
    s.SECTION_KUBE,
    s.SECTION_WAITING,
)
# The fields each section opens with (the ones a person changes first); the others follow in RunSpec order.
FORM_LEADS: dict[str, tuple[str, ...]] = {
    s.SECTION_RUN: ("mode", "recipe", "stop_after"),
    s.SECTION_LOCATION: ("project", "zone", "region"),
    s.SECTION_GPU: ("gpu_type", "worker_replicas", "gpu_pool_max_nodes", "capacity", "reservation"),
    s.SECTION_TRAINING: ("max_steps", "num_prompts_per_step", "num_generations_per_prompt", "extra_overrides"),
    s.SECTION_LOGGING: ("wandb_enabled", "wandb_project", "wandb_run_name"),
    s.SECTION_TEARDOWN: ("teardown_policy", "export_bucket", "accept_checkpoint_loss"),
    s.SECTION_MODEL: ("eval_benchmark", "publish"),
    s.SECTION_STORAGE: ("lustre_capacity_gib", "lustre_throughput"),
    s.SECTION_WAITING: ("poll_interval_s", "job_timeout_s"),
}


def form_section(field: dataclasses.Field[Any]) -> str:
    """The form section a RunSpec field is shown in."""
    section = field.metadata["section"]
    return FORM_SECTION_TITLES.get(section, section)


def form_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The RunSpec fields in form order: sections by :data:`FORM_SECTION_ORDER` (unknown ones last, in RunSpec
    order), each opening with its :data:`FORM_LEADS`."""
    fields = spec_fields()
    sections = list(FORM_SECTION_ORDER)
    sections += [f.metadata["section"] for f in fields if f.metadata["section"] not in sections]
    declared = {f.name: n for n, f in enumerate(fields)}

    def rank(field: dataclasses.Field[Any]) -> tuple[int, int, int]:
        section = field.metadata["section"]
        leads = FORM_LEADS.get(section, ())
        lead = leads.index(field.name) if field.name in leads else len(leads)
        return sections.index(section), lead, declared[field.name]

    return tuple(sorted(fields, key=rank))


# The JSON Schema dialect of every Param. Airflow validates each Param of the DAG at every task try (and at every
# trigger), and jsonschema checks the schema itself against its dialect's metaschema each time: draft 2020-12's (the
# default) takes 4x longer than draft-07's, about 20 ms of every task try for this DAG's 74 Params. The Params use
# only keywords whose meaning is the same in both.
PARAM_SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


def _is_optional(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return isinstance(kind, list) and "null" in kind


def build_params(overrides: dict[str, Any] | None = None) -> dict[str, Param]:
    """One Param per RunSpec field, in form order, with type, enum, range, title, description and section.

    ``overrides`` replaces some defaults (a schedule's partial conf). An optional field whose default is empty
    starts as None: the form then leaves it blank and submits it (a null means the RunSpec default), where an empty
    string or list in a typed field would mark it missing and block Trigger (FACTS §11).
    """
    # A parameter the recipe gives a value to starts empty (the chosen recipe's), unless the schedule sets it.
    blank = {name: None for name in recipe_defaulted()}
    defaults = {**default_conf(), **blank, **(overrides or {})}
    return {f.name: run_param(f.name, defaults[f.name], section=form_section(f)) for f in form_fields()}


def run_param(name: str, value: Any, *, description: str | None = None, section: str | None = None) -> Param:
    """The Param of one RunSpec field: its type, bounds and title as the RunSpec declares them, starting at
    ``value``; ``description`` replaces the field's own (another form that asks for the same value, such as the
    sweeper's project) and ``section`` places it in the run's form."""
    schema = param_schema(name)
    own = schema.pop("description")
    if _is_optional(schema) and value in ("", []):
        value = None
    if section is not None:
        schema["section"] = section
    return form_param(value, description or own, **schema)


def form_param(value: Any, description: str, **schema: Any) -> Param:
    """A Param of this package's forms: ``schema`` (type, bounds, title, section) in :data:`PARAM_SCHEMA_DIALECT`."""
    return Param(value, description=description, schema={"$schema": PARAM_SCHEMA_DIALECT, **schema})


SWEEP_PROJECT_DESCRIPTION = "The Google Cloud project whose run-group leases are swept."
# How long a warm group may idle before the sweeper deletes it: at most a year.
WARM_TTL_MAX_HOURS = 24 * 365


def sweeper_params() -> dict[str, Param]:
    """The sweeper DAG's form: the run's own ``project`` parameter (same type, bounds and title: the sweep checks it
    with the run's rules), a dry-run switch and the warm TTL."""
    return {
        "project": run_param("project", default_conf()["project"], description=SWEEP_PROJECT_DESCRIPTION),
        "dry_run": form_param(
            False,
            "Report what would be deleted and kept; write nothing (not even a lease).",
            type="boolean",
            title="Dry run",
        ),
        "warm_ttl_hours": form_param(
            24,
            "A warm group (its last run kept the cluster and storage) idle longer than this is deleted. "
            "A scheduled group idles for its schedule file's own warm_ttl_hours instead.",
            type="number",
            title="Warm TTL (hours)",
            exclusiveMinimum=0,
            maximum=WARM_TTL_MAX_HOURS,
        ),
    }
