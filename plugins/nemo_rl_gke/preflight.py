"""Offline preflight: every problem of a conf that can be known before anything is created, all at once.

Conf-shape problems (unknown keys, types, ranges) come from the RunSpec schema; semantic problems from the rules
registered in :mod:`nemo_rl_gke.resource_rules` and :mod:`nemo_rl_gke.nemo_rules`. A parameter with a shape
problem is left at its default for the semantic pass, and findings about it are dropped, so one run of the
validator reports every independent mistake without echoing the same one twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Importing the rule modules registers their rules.
from nemo_rl_gke import nemo_rules, resource_rules  # noqa: F401
from nemo_rl_gke.findings import ConfError, Finding
from nemo_rl_gke.recipes import RecipeError, load_recipe
from nemo_rl_gke.rules import REGISTRY, Rule
from nemo_rl_gke.spec import RunSpec, conf_findings


def check_spec(spec: RunSpec) -> list[Finding]:
    """Run every registered rule on a well-typed spec; an empty list means the conf is good."""
    try:
        recipe = load_recipe(spec.recipe)
    except RecipeError as exc:
        return [Finding("recipe.load", ("recipe",), spec.recipe, str(exc), "fix the recipe file or pick another")]
    return [finding for rule in rules() for finding in rule.run(spec, recipe)]


def check_conf(conf: Mapping[str, Any]) -> tuple[RunSpec | None, list[Finding]]:
    """Validate a raw conf: the spec (when the conf is fully valid) and every finding."""
    shape = conf_findings(conf)
    bad = {f.param for f in shape}
    spec = RunSpec.from_conf({k: v for k, v in conf.items() if k not in bad})
    semantic = [f for f in check_spec(spec) if not bad.intersection(f.params)]
    findings = shape + semantic
    return (None if findings else spec), findings


def validate(conf: Mapping[str, Any]) -> RunSpec:
    """The spec of a valid conf, or :class:`ConfError` with every finding."""
    spec, findings = check_conf(conf)
    if spec is None:
        raise ConfError(findings)
    return spec


def rules() -> list[Rule]:
    """Every offline rule, resource rules first, in registration order."""
    return sorted(REGISTRY.values(), key=lambda r: r.category != "resource")
