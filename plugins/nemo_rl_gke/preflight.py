"""Offline preflight: every problem of a conf that can be known before anything is created, all at once.

Conf-shape problems (unknown keys, types, ranges) come from the RunSpec schema; semantic problems from the rules
registered in :mod:`nemo_rl_gke.resource_rules` and :mod:`nemo_rl_gke.nemo_rules`. A parameter with a shape
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
from nemo_rl_gke import nemo_rules, resource_rules  # noqa: F401
from nemo_rl_gke.deployment import Deployment
from nemo_rl_gke.findings import ConfError, Finding, shown
from nemo_rl_gke.recipes import Recipe, RecipeError, load_recipe
from nemo_rl_gke.rules import REGISTRY, Rule, Violation, rule
from nemo_rl_gke.spec import BATCH_MAX, PARAM_NAMES, TP_MAX, RunSpec, conf_findings

log = logging.getLogger(__name__)

# Sizes of the effective config that the NeMo RL rules compute with: each must be a whole number in its range, or
# the arithmetic divides by zero, raises on a string, or (a prime batch size of 10**12) searches for ever.
CONFIG_NUMBERS: dict[str, tuple[int, int]] = {
    "policy.train_global_batch_size": (1, BATCH_MAX),
    "policy.train_micro_batch_size": (1, BATCH_MAX),
    "policy.logprob_batch_size": (1, BATCH_MAX),
    "grpo.num_prompts_per_step": (1, BATCH_MAX),
    "grpo.num_generations_per_prompt": (1, BATCH_MAX),
    "cluster.num_nodes": (1, TP_MAX),
    "cluster.gpus_per_node": (1, TP_MAX),
    "policy.dtensor_cfg.tensor_parallel_size": (1, TP_MAX),
    "policy.dtensor_cfg.context_parallel_size": (1, TP_MAX),
    "policy.generation.vllm_cfg.tensor_parallel_size": (1, TP_MAX),
    "policy.generation.vllm_cfg.pipeline_parallel_size": (1, TP_MAX),
    "policy.generation.colocated.resources.num_nodes": (0, TP_MAX),
    "policy.generation.colocated.resources.gpus_per_node": (1, TP_MAX),
}


class EffectiveConfigError(RecipeError):
    """The effective config has sizes the NeMo RL rules cannot compute with; they skip it, one rule reports it."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def config_number_problems(cfg: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """Sizes in ``cfg`` that are not whole numbers in range, or that an override deleted from ``base``."""
    problems = []
    for key, (low, high) in CONFIG_NUMBERS.items():
        if key not in cfg:
            if base.get(key) is not None:
                problems.append(f"{key} was deleted, and NeMo RL needs it")
            continue
        value = cfg[key]
        if value is None and base.get(key) is None:
            continue
        if type(value) is not int or not low <= value <= high:
            problems.append(f"{key} must be a whole number from {low} to {high}, not {shown(value)}")
    return problems


class _CheckedRecipe:
    """A recipe as the rules of one check see it: the overrides are rendered and the effective config computed once,
    not once per rule, and the config is refused (as a RecipeError, which the NeMo RL rules already skip) when its
    sizes are unusable."""

    def __init__(self, recipe: Recipe) -> None:
        self._recipe = recipe
        self._overrides: dict[RunSpec, list[Any] | Exception] = {}
        self._effective: dict[RunSpec, dict[str, Any] | RecipeError] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recipe, name)

    def render_overrides(self, spec: RunSpec) -> list[Any]:
        """The recipe's rendered overrides for ``spec``, computed once per check."""
        if spec not in self._overrides:
            try:
                self._overrides[spec] = self._recipe.render_overrides(spec)
            except Exception as exc:
                self._overrides[spec] = exc
        cached = self._overrides[spec]
        if isinstance(cached, Exception):
            raise cached
        return list(cached)

    def effective_config(self, spec: RunSpec) -> dict[str, Any]:
        """The recipe's effective config for ``spec`` (a fresh copy: rules may not share mutations)."""
        if spec not in self._effective:
            try:
                # The recipe's own method, run on this view so that it reuses the overrides rendered above.
                cfg = type(self._recipe).effective_config(self, spec)  # type: ignore[arg-type]
                problems = config_number_problems(cfg, self._recipe.base_values)
                self._effective[spec] = EffectiveConfigError(problems) if problems else cfg
            except RecipeError as exc:
                self._effective[spec] = exc
            except Exception as exc:
                # An override the recipe code cannot apply: one finding (below) instead of a crash in every rule.
                problem = f"the overrides cannot be applied to the recipe's config ({type(exc).__name__})"
                self._effective[spec] = EffectiveConfigError([problem])
        cached = self._effective[spec]
        if isinstance(cached, RecipeError):
            raise cached
        return dict(cached)


@rule(
    "nemo.config-numbers",
    nemo_rules.NEMO,
    "Batch and parallel sizes of the effective config are whole numbers in range",
    example={"extra_overrides": ["policy.train_global_batch_size=0"]},
    counter_example={"extra_overrides": ["policy.train_global_batch_size=1024"]},
)
def config_numbers(spec: RunSpec, recipe: Recipe) -> Any:
    """NeMo RL divides by these sizes; a zero, a string or an astronomic value would fail only on the cluster."""
    try:
        cfg = recipe.effective_config(spec)
        problems = config_number_problems(cfg, recipe.base_values)
    except EffectiveConfigError as exc:
        problems = exc.problems
    except RecipeError:
        return  # reported by nemo.override-keys
    for problem in problems:
        yield Violation(
            ("extra_overrides",),
            list(spec.extra_overrides),
            problem,
            "change or remove the extra override that sets it; the other NeMo RL checks skip this conf until then",
        )


def check_spec(spec: RunSpec, deployment: Deployment | None = None) -> list[Finding]:
    """Run every registered rule on a well-typed spec; an empty list means the conf is good.

    ``deployment`` gives the allowed connections and installer URLs; None means the defaults.
    """
    deployment = deployment or Deployment()
    try:
        recipe = load_recipe(spec.recipe)
    except RecipeError as exc:
        return [Finding("recipe.load", ("recipe",), spec.recipe, str(exc), "fix the recipe file or pick another")]
    checked = _CheckedRecipe(recipe)
    findings: list[Finding] = []
    for each in rules():
        findings += _run_rule(each, spec, checked, deployment)
    return findings


def _run_rule(each: Rule, spec: RunSpec, recipe: Any, deployment: Deployment) -> list[Finding]:
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
    :func:`nemo_rl_gke.deployment.load_deployment`).
    """
    shape = conf_findings(conf)
    if not isinstance(conf, Mapping):
        return None, shape
    bad = {f.param for f in shape}
    usable = {k: v for k, v in conf.items() if k in PARAM_NAMES and k not in bad}
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
    """Every offline rule, resource rules first, in registration order."""
    return sorted(REGISTRY.values(), key=lambda r: r.category != "resource")
