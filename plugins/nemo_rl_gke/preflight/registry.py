"""The preflight rule registry: every offline rule, with a conf that trips it and one that does not.

The registry feeds the validator, the docs table (``python -m nemo_rl_gke rules``) and the per-rule tests, so a
rule cannot exist without an example and a documented message. A rule that needs the deployment's settings (which
connections, which installer URLs) says so, and gets the :class:`~nemo_rl_gke.run.deployment.Deployment` as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.findings import Finding

if TYPE_CHECKING:
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec


@dataclass(frozen=True)
class Violation:
    """What a rule check yields; the registry stamps it with the rule id to make a :class:`Finding`."""

    params: tuple[str, ...]
    value: Any
    rule: str
    fix: str


# (spec, recipe) -> violations, or (spec, recipe, deployment) -> violations for a rule registered with uses_deployment.
Check = Callable[..., Iterable[Violation]]


@dataclass(frozen=True)
class Rule:
    """One offline preflight rule."""

    rule_id: str
    category: str
    title: str
    check: Check
    example: dict[str, Any]
    counter_example: dict[str, Any] = field(default_factory=dict)
    # Some rules guard recipe files rather than the conf: their example patches the recipe (dataclasses.replace).
    example_recipe: dict[str, Any] = field(default_factory=dict)
    uses_deployment: bool = False
    # A bound that the default deployment leaves open (allowed_recipes) trips only under these settings.
    example_deployment: dict[str, Any] = field(default_factory=dict)

    def run(self, spec: RunSpec, recipe: Recipe, deployment: Deployment | None = None) -> Iterator[Finding]:
        """Findings of this rule for one spec (a deployment-dependent rule uses the defaults when given none)."""
        args = (spec, recipe, deployment or Deployment()) if self.uses_deployment else (spec, recipe)
        for v in self.check(*args):
            yield Finding(self.rule_id, v.params, v.value, v.rule, v.fix)


REGISTRY: dict[str, Rule] = {}


def rule(
    rule_id: str,
    category: str,
    title: str,
    *,
    example: dict[str, Any],
    counter_example: dict[str, Any] | None = None,
    example_recipe: dict[str, Any] | None = None,
    uses_deployment: bool = False,
    example_deployment: dict[str, Any] | None = None,
) -> Callable[[Check], Check]:
    """Register a check under ``rule_id`` with a conf that trips it (``example``) and one that passes.

    With ``uses_deployment`` the check takes the deployment as a third argument; its examples are judged against
    the default deployment, or against ``example_deployment``'s settings when given.
    """

    def register(check: Check) -> Check:
        if rule_id in REGISTRY:
            raise ValueError(f"duplicate preflight rule id {rule_id}")
        REGISTRY[rule_id] = Rule(
            rule_id,
            category,
            title,
            check,
            example,
            counter_example or {},
            example_recipe or {},
            uses_deployment,
            example_deployment or {},
        )
        return check

    return register
