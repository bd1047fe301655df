"""Offline preflight: every problem of a conf that can be known before anything is created, all at once.

Conf-shape problems (unknown keys, types, ranges) come from the RunSpec schema; semantic problems from the rules
registered in :mod:`nemo_rl_gke.preflight.resources` and :mod:`nemo_rl_gke.preflight.nemo`. A parameter with a shape
problem is left at its default for the semantic pass, and findings about it are dropped, so one run of the
validator reports every independent mistake without echoing the same one twice.

Validation is total: :func:`check_conf` returns findings for any input and never raises. A rule that fails on a conf
refuses it (a ``preflight.rule-error`` finding) rather than letting it through or crashing the task.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from typing import Any

# Importing the rule modules registers their rules.
from nemo_rl_gke.preflight import bounds, nemo, resources  # noqa: F401
from nemo_rl_gke.preflight.registry import REGISTRY, Rule
from nemo_rl_gke.run import budget  # noqa: F401
from nemo_rl_gke.run.conf_checks import conf_findings
from nemo_rl_gke.run.conf_schema import PARAM_NAMES
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.findings import ConfError, Finding
from nemo_rl_gke.run.hydra_overrides import RecipeError
from nemo_rl_gke.run.recipes import Recipe, load_recipe, with_recipe_defaults
from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)


def check_spec(spec: RunSpec, deployment: Deployment | None = None) -> list[Finding]:
    """Run every registered rule on a well-typed spec; an empty list means the conf is good.

    ``deployment`` gives the allowed connections, installer URLs and the bounds; None means the defaults.
    """
    deployment = deployment or Deployment()
    try:
        recipe = load_recipe(spec.recipe)
    except RecipeError as exc:
        return [Finding("recipe.load", ("recipe",), spec.recipe, str(exc), "fix the recipe file or pick another")]
    findings: list[Finding] = []
    for each in rules():
        findings += _run_rule(each, spec, recipe, deployment)
    return findings


def _run_rule(each: Rule, spec: RunSpec, recipe: Recipe, deployment: Deployment) -> list[Finding]:
    try:
        return list(each.run(spec, recipe, deployment))
    except Exception as exc:
        # Fail closed: a rule that cannot judge a conf refuses it. The message names the rule and the error type
        # only, since an exception's text may quote conf values.
        where = traceback.extract_tb(exc.__traceback__)[-1]
        log.warning("preflight rule %s failed with %s at %s:%s", each.rule_id, type(exc).__name__, where[0], where[1])
        return [
            Finding(
                "preflight.rule-error",
                ("conf",),
                "<not shown>",
                f"rule {each.rule_id} could not check this conf ({type(exc).__name__}), so the conf is refused "
                "rather than let through",
                f"change the values rule {each.rule_id} reads (see docs/preflight-rules.md), and report the conf",
            )
        ]


def check_conf(conf: Any, deployment: Deployment | None = None) -> tuple[RunSpec | None, list[Finding]]:
    """Validate a raw conf: the spec (when the conf is fully valid) and every finding. Never raises.

    ``deployment`` gives the allowed connections and installer URLs; None means the defaults (tasks pass
    :func:`nemo_rl_gke.run.deployment.load_deployment`).
    """
    shape = conf_findings(conf)
    if not isinstance(conf, Mapping):
        return None, shape
    bad = {f.param for f in shape}
    usable = with_recipe_defaults({k: v for k, v in conf.items() if k in PARAM_NAMES and k not in bad})
    spec = RunSpec.from_conf(usable)
    semantic = [f for f in check_spec(spec, deployment) if not bad.intersection(f.params)]
    findings = shape + semantic
    return (None if findings else spec), findings


def validate(conf: Any, deployment: Deployment | None = None) -> RunSpec:
    """The spec of a valid conf, or :class:`ConfError` with every finding."""
    spec, findings = check_conf(conf, deployment)
    if spec is None:
        raise ConfError(findings)
    return spec


def rules() -> list[Rule]:
    """Every offline rule: the deployment's bounds first, then resource rules, in registration order."""
    order = {"deployment": 0, "resource": 1}
    return sorted(REGISTRY.values(), key=lambda r: order.get(r.category, 2))
