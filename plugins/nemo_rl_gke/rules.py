"""The preflight rule registry: every offline rule, with a conf that trips it and one that does not.

The registry feeds the validator, the docs table (``python -m nemo_rl_gke rules``) and the per-rule tests, so a
rule cannot exist without an example and a documented message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.findings import Finding

if TYPE_CHECKING:
    from nemo_rl_gke.recipes import Recipe
    from nemo_rl_gke.spec import RunSpec


@dataclass(frozen=True)
class Violation:
    """What a rule check yields; the registry stamps it with the rule id to make a :class:`Finding`."""

    params: tuple[str, ...]
    value: Any
    rule: str
    fix: str


Check = Callable[["RunSpec", "Recipe"], Iterable[Violation]]


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

    def run(self, spec: RunSpec, recipe: Recipe) -> Iterator[Finding]:
        """Findings of this rule for one spec."""
        for v in self.check(spec, recipe):
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
) -> Callable[[Check], Check]:
    """Register a check under ``rule_id`` with a conf that trips it (``example``) and one that passes."""

    def register(check: Check) -> Check:
        if rule_id in REGISTRY:
            raise ValueError(f"duplicate preflight rule id {rule_id}")
        REGISTRY[rule_id] = Rule(rule_id, category, title, check, example, counter_example or {}, example_recipe or {})
        return check

    return register
