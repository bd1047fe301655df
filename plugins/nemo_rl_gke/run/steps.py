"""How many GRPO steps a run's job takes: ``max_steps``, or fewer when the recipe dataset's epochs run out first.

A fact about the run, derived from the RunSpec and its recipe (:func:`final_step`); the NeMo RL rules check it, the
plan prints it and the checkpoint steps validate the step it ends at. The RunSpec itself reads no recipe: it is the
conf, and what a recipe or the deployment adds is computed here and in :mod:`nemo_rl_gke.run.budget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.hydra_overrides import RecipeError

if TYPE_CHECKING:
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec

# Sizes the rules compute with, each with its default when absent or null (None: required). Each must be a
# positive integer in the effective config, or nemo.config-integers reports it and the arithmetic rules stay silent.
COUNTS: dict[str, int | None] = {
    "cluster.num_nodes": None,
    "cluster.gpus_per_node": None,
    "grpo.num_prompts_per_step": None,
    "grpo.num_generations_per_prompt": None,
    "policy.train_global_batch_size": None,
    "policy.dtensor_cfg.tensor_parallel_size": 1,
    "policy.dtensor_cfg.context_parallel_size": 1,
    "policy.generation.vllm_cfg.tensor_parallel_size": 1,
    "policy.generation.vllm_cfg.pipeline_parallel_size": 1,
}
# Beyond a C int no size is meaningful, and bounded numbers keep every rule's arithmetic cheap.
MAX_COUNT = 2**31 - 1


@dataclass(frozen=True)
class StepBudget:
    """How many GRPO steps the job runs: ``max_steps``, or fewer when the dataset's epochs run out first.

    NeMo RL's loop ends at ``grpo.max_num_steps`` or after ``grpo.max_num_epochs`` passes over a dataloader of
    ``num_prompts_per_step`` prompts a batch with the last partial batch dropped, whichever comes first.
    """

    max_steps: int
    train_examples: int
    prompts_per_step: int
    max_epochs: int
    dataset: str = ""

    @property
    def steps_per_epoch(self) -> int:
        """Full batches of prompts in one pass over the training split."""
        return self.train_examples // self.prompts_per_step

    @property
    def epoch_cap(self) -> int:
        """The most steps the dataset allows."""
        return self.steps_per_epoch * self.max_epochs

    @property
    def effective(self) -> int:
        """The steps the job will run."""
        return min(self.max_steps, self.epoch_cap)

    @property
    def capped(self) -> bool:
        """Whether the epoch cap cuts ``max_steps``."""
        return self.epoch_cap < self.max_steps

    def explain(self) -> str:
        """The arithmetic, for the validate log and the plan."""
        dataset = f" of {self.dataset}" if self.dataset else ""
        arithmetic = (
            f"{self.train_examples} training examples{dataset} / {self.prompts_per_step} prompts per step = "
            f"{self.steps_per_epoch} steps per epoch x grpo.max_num_epochs {self.max_epochs} = {self.epoch_cap}"
        )
        if not self.capped:
            return f"{self.effective} steps (max_steps; the epoch cap is {arithmetic})"
        return (
            f"{self.effective} steps, not max_steps={self.max_steps}: the epoch cap is {arithmetic}. The job stops "
            f"at step {self.effective} and that checkpoint is the one validated and exported; to train longer raise "
            "grpo.max_num_epochs in extra_overrides"
        )


def step_budget(spec: RunSpec, recipe: Recipe) -> StepBudget | None:
    """The run's step budget, or None when the effective config or the dataset's size is unknown."""
    cfg = effective_config(spec, recipe)
    if cfg is None:
        return None
    examples = recipe.train_example_count(spec, cfg)
    epochs = cfg.get("grpo.max_num_epochs")
    if examples is None or isinstance(epochs, bool) or not isinstance(epochs, int) or not 1 <= epochs <= MAX_COUNT:
        return None
    return StepBudget(spec.max_steps, examples, cfg["grpo.num_prompts_per_step"], epochs, recipe.dataset)


def final_step(spec: RunSpec, recipe: Recipe) -> int:
    """The step the run's last checkpoint is saved at: NeMo RL saves at its last step, ``max_steps`` or the recipe
    dataset's epoch cap when that comes first (:class:`StepBudget`)."""
    budget = step_budget(spec, recipe)
    return budget.effective if budget is not None and budget.epoch_cap else spec.max_steps


def config_count(cfg: dict[str, Any], key: str) -> int | None:
    """A size from the effective config: its default when absent or null, None when it is not a valid count."""
    value = cfg.get(key)
    if value is None:
        return COUNTS.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        return None
    return value


def effective_config(spec: RunSpec, recipe: Recipe) -> dict[str, Any] | None:
    """The effective config when every size the rules compute with is a valid count, else None.

    Bad sizes are reported once, by nemo.config-integers; the arithmetic rules stay silent rather than divide by
    zero or mislead.
    """
    try:
        cfg = recipe.effective_config(spec)
    except RecipeError:
        return None  # the base config itself is broken
    if any(config_count(cfg, key) is None for key in COUNTS):
        return None
    return cfg
