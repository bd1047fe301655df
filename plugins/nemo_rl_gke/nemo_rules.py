"""Offline preflight rules for NeMo RL, for the recipe's pinned version (FACTS §7).

NeMo RL checks most of these only at the first training step, after a full generation pass on every GPU, and some
never. Each rule here reads the *effective* config (the recipe's base config with the run's overrides applied), so
it checks what NeMo RL will actually run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.recipes import Override, RecipeError
from nemo_rl_gke.rules import Violation, rule

if TYPE_CHECKING:
    from nemo_rl_gke.recipes import Recipe
    from nemo_rl_gke.spec import RunSpec

NEMO = "nemo-rl"
TP_ENV = "NRL_IGNORE_TP_ACCURACY_CHECK"
# Keys the RunSpec owns: an extra override of one would make the plan, the cluster and the job disagree.
BOUND_KEYS = {
    "cluster.num_nodes": "worker_replicas",
    "cluster.gpus_per_node": "gpu_type",
    "checkpointing.checkpoint_dir": "checkpoint_dir",
    "grpo.max_num_steps": "max_steps",
    "grpo.num_prompts_per_step": "num_prompts_per_step",
    "grpo.num_generations_per_prompt": "num_generations_per_prompt",
    "policy.generation.colocated.enabled": "colocated",
    "policy.generation.colocated.resources.num_nodes": "generation_nodes",
    "policy.generation.colocated.resources.gpus_per_node": "generation_gpus_per_node",
    "policy.dtensor_cfg.tensor_parallel_size": "dtensor_tp",
    "policy.generation.vllm_cfg.tensor_parallel_size": "vllm_tp",
    "policy.generation.vllm_cfg.gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "logger.wandb_enabled": "wandb_enabled",
    "logger.wandb.name": "wandb_run_name",
    "logger.wandb.project": "wandb_project",
}


@dataclass(frozen=True)
class Layout:
    """How NeMo RL will split the GPUs, from the effective config (grpo.py setup(), lm_policy.py)."""

    colocated: bool
    num_nodes: int
    gpus_per_node: int
    train_gpus: int
    generation_gpus: int
    problem: str = ""

    @property
    def error(self) -> bool:
        """Whether NeMo RL would refuse this split at setup."""
        return bool(self.problem)


def layout(cfg: dict[str, Any]) -> Layout:
    """Training and generation GPU counts, or the reason NeMo RL would refuse the split."""
    nodes = int(cfg.get("cluster.num_nodes") or 0)
    gpn = int(cfg.get("cluster.gpus_per_node") or 0)
    if cfg.get("policy.generation.colocated.enabled", True):
        return Layout(True, nodes, gpn, nodes * gpn, nodes * gpn)
    gen_nodes = cfg.get("policy.generation.colocated.resources.num_nodes")
    gen_gpn = cfg.get("policy.generation.colocated.resources.gpus_per_node")
    if nodes == 1:
        if not gen_gpn or gen_gpn >= gpn or gen_nodes not in (None, 1):
            return Layout(
                False, nodes, gpn, 0, 0, "on one node, generation takes 1..gpus_per_node-1 GPUs and at most 1 node"
            )
        return Layout(False, nodes, gpn, gpn - gen_gpn, gen_gpn)
    if not gen_nodes or gen_gpn != gpn:
        return Layout(
            False,
            nodes,
            gpn,
            0,
            0,
            f"with {nodes} nodes, generation needs at least one whole node and its gpus_per_node "
            f"({gen_gpn}) must equal the cluster's ({gpn})",
        )
    if gen_nodes >= nodes:
        return Layout(
            False, nodes, gpn, 0, 0, f"generation takes {gen_nodes} of {nodes} nodes, leaving none for training"
        )
    return Layout(False, nodes, gpn, (nodes - gen_nodes) * gpn, gen_nodes * gpn)


def _tp(cfg: dict[str, Any]) -> int:
    return int(cfg.get("policy.dtensor_cfg.tensor_parallel_size") or 1)


def _cp(cfg: dict[str, Any]) -> int:
    return int(cfg.get("policy.dtensor_cfg.context_parallel_size") or 1)


def data_parallel(cfg: dict[str, Any]) -> int:
    """DP = training world size / (TP x CP); 0 when the split itself is invalid."""
    lay = layout(cfg)
    model_parallel = _tp(cfg) * _cp(cfg)
    if lay.error or lay.train_gpus % model_parallel:
        return 0
    return lay.train_gpus // model_parallel


def _effective(spec: RunSpec, recipe: Recipe) -> dict[str, Any] | None:
    try:
        return recipe.effective_config(spec)
    except RecipeError:
        return None  # reported by nemo.override-keys


@rule(
    "nemo.world-size",
    NEMO,
    "Generation resources leave GPUs for training",
    example={"worker_replicas": 2, "generation_nodes": 2},
    counter_example={"worker_replicas": 3, "gpu_pool_max_nodes": 3, "generation_nodes": 2},
)
def world_size(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Non-colocated generation takes whole nodes (or, on one node, some of its GPUs); training gets the rest."""
    cfg = _effective(spec, recipe)
    if cfg is None:
        return
    lay = layout(cfg)
    if lay.error:
        yield Violation(
            ("generation_nodes", "worker_replicas", "generation_gpus_per_node", "colocated"),
            spec.generation_nodes,
            f"NeMo RL refuses this split: {lay.problem}",
            f"with {spec.worker_replicas} node(s) of {spec.gpus_per_node} GPUs use generation_nodes between 1 and "
            f"{max(spec.worker_replicas - 1, 0)} with generation_gpus_per_node={spec.gpus_per_node}, add worker "
            "replicas, or set colocated=true",
        )


@rule(
    "nemo.dtensor-tp-divides",
    NEMO,
    "DTensor TP (x CP) divides the training GPUs",
    example={"dtensor_tp": 16},
    counter_example={"dtensor_tp": 4},
)
def dtensor_tp_divides(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """lm_policy.py refuses a training world that is not a multiple of TP x CP."""
    cfg = _effective(spec, recipe)
    if cfg is None or layout(cfg).error:
        return
    lay, model_parallel = layout(cfg), _tp(cfg) * _cp(cfg)
    if lay.train_gpus % model_parallel:
        yield Violation(
            ("dtensor_tp",),
            spec.dtensor_tp,
            f"DTensor TP {_tp(cfg)} x CP {_cp(cfg)} = {model_parallel} does not divide the {lay.train_gpus} "
            "training GPUs",
            f"use a dtensor_tp that divides {lay.train_gpus // _cp(cfg)} (e.g. {spec.gpus_per_node})",
        )


@rule(
    "nemo.vllm-tp-divides",
    NEMO,
    "vLLM TP divides the generation GPUs",
    example={"vllm_tp": 16},
    counter_example={"vllm_tp": 4},
)
def vllm_tp_divides(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """vllm_generation.py needs the generation world to be a multiple of TP x PP."""
    cfg = _effective(spec, recipe)
    if cfg is None or layout(cfg).error:
        return
    lay = layout(cfg)
    pp = int(cfg.get("policy.generation.vllm_cfg.pipeline_parallel_size") or 1)
    tp = int(cfg.get("policy.generation.vllm_cfg.tensor_parallel_size") or 1)
    if lay.generation_gpus % (tp * pp):
        yield Violation(
            ("vllm_tp",),
            spec.vllm_tp,
            f"vLLM TP {tp} x PP {pp} does not divide the {lay.generation_gpus} generation GPUs",
            f"use a vllm_tp that divides {lay.generation_gpus}",
        )


@rule(
    "nemo.tp-divides-heads",
    NEMO,
    "TP divides the model's attention and KV heads",
    example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 8, "vllm_tp": 4},
    counter_example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
)
def tp_divides_heads(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Sharding heads across TP ranks needs whole heads per rank; NeMo RL finds out only after loading the model."""
    heads = int(recipe.model["num_attention_heads"])
    kv_heads = int(recipe.model["num_key_value_heads"])
    for param, tp in (("dtensor_tp", spec.dtensor_tp), ("vllm_tp", spec.vllm_tp)):
        if heads % tp or kv_heads % tp:
            good = [d for d in (1, 2, 4, 8, 16) if heads % d == 0 and kv_heads % d == 0]
            yield Violation(
                (param,),
                tp,
                f"{recipe.model['name']} has {heads} attention and {kv_heads} KV heads; TP {tp} does not divide both",
                f"use one of {', '.join(map(str, good))}",
            )


@rule(
    "nemo.batch-multiple",
    NEMO,
    "Prompts x generations is a multiple of train_global_batch_size",
    example={"num_prompts_per_step": 12},
    counter_example={"num_prompts_per_step": 32},
)
def batch_multiple(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """shard_by_batch_size asserts it at the first training step, after a whole generation pass."""
    cfg = _effective(spec, recipe)
    if cfg is None:
        return
    rollout = int(cfg["grpo.num_prompts_per_step"]) * int(cfg["grpo.num_generations_per_prompt"])
    gbs = int(cfg["policy.train_global_batch_size"])
    if rollout % gbs:
        yield Violation(
            ("num_prompts_per_step", "num_generations_per_prompt"),
            spec.num_prompts_per_step,
            f"{cfg['grpo.num_prompts_per_step']} prompts x {cfg['grpo.num_generations_per_prompt']} generations = "
            f"{rollout} samples per step is not a multiple of train_global_batch_size {gbs}; NeMo RL fails at the "
            "first training step, after the first generation pass",
            f"make prompts x generations a multiple of {gbs} (e.g. num_prompts_per_step="
            f"{_next_multiple(spec.num_prompts_per_step, gbs, int(cfg['grpo.num_generations_per_prompt']))}), "
            "or set policy.train_global_batch_size in extra_overrides",
        )


def _next_multiple(prompts: int, gbs: int, generations: int) -> int:
    while (prompts * generations) % gbs:
        prompts += 1
    return prompts


@rule(
    "nemo.batch-divisible-by-dp",
    NEMO,
    "train_global_batch_size is divisible by the data-parallel size",
    example={
        "dtensor_tp": 1,
        "extra_overrides": ["policy.train_global_batch_size=500"],
        "num_prompts_per_step": 125,
        "num_generations_per_prompt": 4,
    },
    counter_example={"dtensor_tp": 1},
)
def batch_divisible_by_dp(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Each DP rank gets train_global_batch_size / DP samples; NeMo RL asserts it at the first training step."""
    cfg = _effective(spec, recipe)
    if cfg is None:
        return
    dp = data_parallel(cfg)
    gbs = int(cfg["policy.train_global_batch_size"])
    if dp and gbs % dp:
        yield Violation(
            ("dtensor_tp", "worker_replicas", "generation_nodes"),
            spec.dtensor_tp,
            f"train_global_batch_size {gbs} is not divisible by the data-parallel size {dp} "
            f"({layout(cfg).train_gpus} training GPUs / TP {_tp(cfg)} / CP {_cp(cfg)})",
            "change dtensor_tp or the number of training nodes so DP divides the global batch, or change "
            "policy.train_global_batch_size",
        )


@rule(
    "nemo.tp-micro-logprob",
    NEMO,
    "v0.6+: with TP >= 4, micro batch equals logprob batch",
    example={
        "recipe": "qwen2.5-7b-gsm8k-v0.7.0",
        "dtensor_tp": 4,
        "vllm_tp": 4,
        "extra_overrides": ["policy.logprob_batch_size=2"],
    },
    counter_example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
)
def tp_micro_logprob(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """lm_policy.py (v0.6.0+) asserts it when the policy is built, unless the check is switched off."""
    cfg = _effective(spec, recipe)
    if cfg is None or not recipe.version.tp_accuracy_check or _tp(cfg) < 4:
        return
    micro, logprob = cfg.get("policy.train_micro_batch_size"), cfg.get("policy.logprob_batch_size")
    if TP_ENV in recipe.env or cfg.get("loss_fn.force_on_policy_ratio") or logprob is None or micro == logprob:
        return
    yield Violation(
        ("dtensor_tp", "extra_overrides"),
        spec.dtensor_tp,
        f"NeMo RL {recipe.nemo_rl_version} asserts train_micro_batch_size == logprob_batch_size when TP >= 4 "
        f"(TP {_tp(cfg)}, micro {micro}, logprob {logprob})",
        f"add policy.logprob_batch_size={micro} to extra_overrides, use dtensor_tp 1 or 2, or set "
        "loss_fn.force_on_policy_ratio=true with global batch = prompts x generations",
    )


@rule(
    "nemo.override-keys",
    NEMO,
    "Override keys exist for the pinned version (key=v vs +key=v)",
    example={"extra_overrides": ["+policy.train_global_batch_size=1024"]},
    counter_example={"extra_overrides": ["policy.train_global_batch_size=1024"]},
)
def override_keys(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Hydra: key=v only sets an existing key, +key=v only adds a missing one, ~key deletes an existing one."""
    try:
        overrides = recipe.render_overrides(spec)
    except RecipeError as exc:
        yield Violation(("extra_overrides",), list(spec.extra_overrides), str(exc), "write key=value")
        return
    keys = set(recipe.base_values)
    added: set[str] = set()
    for override in overrides:
        exists = _exists(override.key, keys | added)
        problem = ""
        if override.op in ("", "~") and not exists:
            problem = f"{override.key} does not exist in {recipe.base_config} at NeMo RL {recipe.nemo_rl_version}"
            fix = f"write +{override.key}=... to add it, or check the key's spelling and the version's layout"
        elif override.op == "+" and exists:
            problem = f"{override.key} already exists in the config, and Hydra's + only adds missing keys"
            fix = f"write {override.key}=... (or ++{override.key}=...)"
        if problem:
            yield Violation(("extra_overrides", "recipe"), override.text, problem, fix)
        added.add(override.key)


def _exists(key: str, keys: set[str]) -> bool:
    return key in keys or any(k.startswith(key + ".") for k in keys)


@rule(
    "nemo.override-bound-key",
    NEMO,
    "Extra overrides leave the conf's own keys alone",
    example={"extra_overrides": ["cluster.num_nodes=4"]},
    counter_example={"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6"]},
)
def override_bound_key(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """The cluster, the checkpoint validator and the job must agree; these keys come from conf parameters."""
    for text in spec.extra_overrides:
        try:
            key = Override.parse(text).key
        except RecipeError:
            continue  # reported by nemo.override-keys
        if key in BOUND_KEYS:
            yield Violation(
                ("extra_overrides",),
                text,
                f"{key} is set from the conf parameter {BOUND_KEYS[key]}, so the cluster, the job and the checkpoint "
                "validator stay consistent",
                f"remove it from extra_overrides and set {BOUND_KEYS[key]} instead",
            )


@rule(
    "nemo.entrypoint",
    NEMO,
    "The recipe's entrypoint exists at its NeMo RL version",
    example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
    counter_example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
    example_recipe={"entrypoint": "examples/run_grpo_math.py"},
)
def entrypoint(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """run_grpo_math.py is gone since v0.6.0; the version's script list comes from the source at that tag."""
    if recipe.entrypoint not in recipe.version.scripts:
        scripts = ", ".join(s for s in recipe.version.scripts if "grpo" in s) or "none"
        yield Violation(
            ("recipe",),
            spec.recipe,
            f"entrypoint {recipe.entrypoint} does not exist at NeMo RL {recipe.nemo_rl_version}",
            f"use one of its GRPO scripts ({scripts}) in the recipe, or a recipe for another version",
        )


@rule(
    "nemo.image-version",
    NEMO,
    "The image tag is the recipe's NeMo RL version",
    example={"image_tag": "v0.7.0"},
    counter_example={"image_tag": "v0.5.0"},
)
def image_version(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Every check above is for the recipe's version; another image runs other code with other keys."""
    if spec.image_tag and not recipe.accepts_tag(spec.image_tag):
        yield Violation(
            ("image_tag", "recipe"),
            spec.image_tag,
            f"recipe {recipe.name} is pinned to NeMo RL {recipe.nemo_rl_version} ({recipe.image}); another image "
            "runs other code, whose scripts and config keys were not checked",
            f"leave image_tag empty, use {recipe.image_tag} or a variant of it ({recipe.image_tag}.<suffix>), or "
            "pick a recipe for that version",
        )
