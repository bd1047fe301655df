"""Offline preflight rules for NeMo RL, for the recipe's pinned version (FACTS §7).

NeMo RL checks most of these only at the first training step, after a full generation pass on every GPU, and some
never. Each rule here reads the *effective* config (the recipe's base config with the run's overrides applied), so
it checks what NeMo RL will actually run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.preflight.registry import Violation, rule
from nemo_rl_gke.run.checkpoint_layout import TORCH_SAVE, layout_of
from nemo_rl_gke.run.conf_schema import EVAL_OFF
from nemo_rl_gke.run.gpu_layout import layout
from nemo_rl_gke.run.hydra_overrides import RecipeError, clip
from nemo_rl_gke.run.recipes import CONF_KEYS, accepted
from nemo_rl_gke.run.steps import COUNTS, MAX_COUNT, config_count, effective_config, step_budget

if TYPE_CHECKING:
    from nemo_rl_gke.run.recipes import Entry, Protected, Recipe
    from nemo_rl_gke.run.spec import RunSpec

NEMO = "nemo-rl"
TP_ENV = "NRL_IGNORE_TP_ACCURACY_CHECK"
# Keys the RunSpec owns: an extra override of one would make the plan, the cluster and the job disagree.
BOUND_KEYS = CONF_KEYS


def _tp(cfg: dict[str, Any]) -> int:
    return config_count(cfg, "policy.dtensor_cfg.tensor_parallel_size") or 1


def _cp(cfg: dict[str, Any]) -> int:
    return config_count(cfg, "policy.dtensor_cfg.context_parallel_size") or 1


def data_parallel(cfg: dict[str, Any]) -> int:
    """DP = training world size / (TP x CP); 0 when the split itself is invalid."""
    lay = layout(cfg)
    model_parallel = _tp(cfg) * _cp(cfg)
    if lay.error or lay.train_gpus % model_parallel:
        return 0
    return lay.train_gpus // model_parallel


@rule(
    "nemo.dataset-has-a-step",
    NEMO,
    "The training split holds at least one batch of prompts",
    example={"num_prompts_per_step": 8192, "num_generations_per_prompt": 1},
    counter_example={"num_prompts_per_step": 7168, "num_generations_per_prompt": 1},
)
def dataset_has_a_step(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """NeMo RL drops the last partial batch: a split smaller than one batch trains no step at all."""
    budget = step_budget(spec, recipe)
    if budget is not None and budget.steps_per_epoch == 0:
        yield Violation(
            ("num_prompts_per_step",),
            spec.num_prompts_per_step,
            f"the training split has {budget.train_examples} examples, fewer than one batch of "
            f"{budget.prompts_per_step} prompts: NeMo RL drops the partial batch and trains no step",
            f"use num_prompts_per_step <= {budget.train_examples}",
        )


@rule(
    "nemo.step-budget",
    NEMO,
    "A run's step budget fits the recipe dataset's epoch cap",
    example={"resume": "latest", "steps_per_run": 500},
    counter_example={"resume": "latest", "steps_per_run": 20},
)
def step_budget_fits(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """NeMo RL stops at the epoch cap whatever max_num_steps says: a budget beyond it would be cut silently."""
    if spec.steps_per_run and not spec.resumes:
        yield Violation(
            ("steps_per_run", "resume"),
            spec.steps_per_run,
            "a step budget counts from the resumed step, and resume is 'none'",
            "set resume=latest, or steps_per_run=0 and max_steps to the steps wanted",
        )
        return
    if not spec.steps_per_run:
        return
    budget = step_budget(dataclasses.replace(spec, max_steps=spec.steps_per_run), recipe)
    if budget is not None and budget.capped:
        yield Violation(
            ("steps_per_run",),
            spec.steps_per_run,
            f"even from step 0 the recipe's epoch cap ends the job first: {budget.explain()}",
            f"use steps_per_run <= {budget.epoch_cap}, or raise grpo.max_num_epochs in extra_overrides",
        )


@rule(
    "nemo.world-size",
    NEMO,
    "Generation resources leave GPUs for training",
    example={"worker_replicas": 2, "generation_nodes": 2},
    counter_example={"worker_replicas": 3, "gpu_pool_max_nodes": 3, "generation_nodes": 2},
)
def world_size(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Non-colocated generation takes whole nodes (or, on one node, some of its GPUs); training gets the rest."""
    cfg = effective_config(spec, recipe)
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
    cfg = effective_config(spec, recipe)
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
    cfg = effective_config(spec, recipe)
    if cfg is None or layout(cfg).error:
        return
    lay = layout(cfg)
    pp = config_count(cfg, "policy.generation.vllm_cfg.pipeline_parallel_size") or 1
    tp = config_count(cfg, "policy.generation.vllm_cfg.tensor_parallel_size") or 1
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
    "nemo.v1-save-format",
    NEMO,
    "The v1 DTensor worker saves with no model_save_format",
    example={"recipe": "gemma3-27b-gsm8k-v0.5.0", "extra_overrides": ["checkpointing.model_save_format=safetensors"]},
    counter_example={"recipe": "gemma3-27b-gsm8k-v0.5.0"},
)
def v1_save_format(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """lm_policy.py raises "model_save_format must be None or omitted if using DTensorPolicyWorker (_v2=False)" at
    the first checkpoint save (v0.5.0 lines 812-818, v0.7.0 lines 1079-1085): after every step before it trained."""
    try:
        cfg = recipe.apply(spec, extra=True).config
    except RecipeError:
        return
    save_format = cfg.get("checkpointing.model_save_format")
    if cfg.get("policy.dtensor_cfg._v2") is False and save_format is not None:
        yield Violation(
            ("extra_overrides",),
            save_format,
            f"checkpointing.model_save_format is {clip(repr(save_format))} with policy.dtensor_cfg._v2=false: "
            "NeMo RL's v1 DTensor worker refuses any model_save_format at the first checkpoint save",
            "set checkpointing.model_save_format=null, or policy.dtensor_cfg._v2=true for the Automodel "
            "safetensors layout",
        )


@rule(
    "eval.benchmark-in-release",
    NEMO,
    "The evaluation benchmark is one the recipe's NeMo RL release offers",
    example={"recipe": "gemma3-27b-gsm8k-v0.5.0", "eval_benchmark": "aime2026"},
    counter_example={"recipe": "gemma3-27b-gsm8k-v0.5.0", "eval_benchmark": "math500"},
)
def eval_benchmark_in_release(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """run_eval.py's load_eval_dataset names its datasets per release (eval_datasets/__init__.py); any other name is
    read as a local file, which would fail after the model was converted and the GPUs waited."""
    offered = recipe.version.eval_datasets
    if spec.eval_benchmark != EVAL_OFF and spec.eval_benchmark not in offered:
        yield Violation(
            ("eval_benchmark", "recipe"),
            spec.eval_benchmark,
            f"NeMo RL {recipe.nemo_rl_version} (recipe {recipe.name}) has no eval dataset {spec.eval_benchmark}",
            f"use one of {', '.join(offered)}, or off",
        )


@rule(
    "eval.samples-need-temperature",
    NEMO,
    "More than one evaluation sample per problem needs a temperature above 0",
    example={"eval_num_tests_per_prompt": 4, "eval_temperature": 0},
    counter_example={"eval_num_tests_per_prompt": 4, "eval_temperature": 0.6},
)
def eval_samples_need_temperature(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """nemo_rl/evals/eval.py asserts temperature > 0 when num_tests_per_prompt > 1 (v0.5.0 lines 108-111, v0.7.0
    lines 111-114): greedy answers would all be the same."""
    if spec.eval_benchmark != EVAL_OFF and spec.eval_num_tests_per_prompt > 1 and spec.eval_temperature <= 0:
        yield Violation(
            ("eval_temperature", "eval_num_tests_per_prompt"),
            spec.eval_temperature,
            f"eval_num_tests_per_prompt={spec.eval_num_tests_per_prompt} samples each problem, but temperature 0 is "
            "greedy: every sample would be the same answer (eval.py refuses it)",
            "set eval_temperature above 0 (0.6, say), or eval_num_tests_per_prompt to 1",
        )


@rule(
    "eval.publish-needs-a-score",
    NEMO,
    "Publishing only a better model needs an evaluation",
    example={"eval_benchmark": "off", "publish": "if_better"},
    counter_example={"eval_benchmark": "off", "publish": "always"},
)
def publish_needs_a_score(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """if_better compares scores: without an evaluation there is nothing to compare."""
    if spec.publish == "if_better" and spec.eval_benchmark == EVAL_OFF:
        yield Violation(
            ("publish", "eval_benchmark"),
            spec.publish,
            "publish=if_better compares the model's score with the last published one's, but eval_benchmark is off",
            "pick an eval_benchmark, or publish always or never",
        )


@rule(
    "eval.promoted-needs-publishing",
    NEMO,
    "Resuming from the promoted model needs a publish policy that can promote one",
    example={"resume": "promoted", "publish": "never"},
    counter_example={"resume": "promoted", "publish": "if_better"},
)
def promoted_needs_publishing(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """With publish=never no model is ever promoted, so every resume=promoted run would start from step 0 and set
    aside what the last one trained."""
    if spec.resume == "promoted" and spec.publish == "never":
        yield Violation(
            ("resume", "publish"),
            spec.resume,
            "resume=promoted continues from the last published model, but publish=never publishes none: every run "
            "would train from step 0",
            "publish if_better (or always), or resume latest",
        )


@rule(
    "eval.hf-export",
    NEMO,
    "The recipe's release can convert the checkpoint layout it writes to Hugging Face",
    example={"recipe": "gemma3-27b-gsm8k-v0.5.0",
             "extra_overrides": ["policy.dtensor_cfg._v2=true", "checkpointing.model_save_format=torch_save"]},
    counter_example={"recipe": "gemma3-27b-gsm8k-v0.5.0"},
)  # fmt: skip
def hf_export_supported(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """v0.5.0's convert_dcp_to_hf.py reads only a .metadata directly in policy/weights (native_checkpoint.py
    convert_dcp_to_hf): the v2 worker's torch_save layout keeps it in policy/weights/model."""
    try:
        cfg = recipe.apply(spec, extra=True).config
    except RecipeError:
        return
    fmt = layout_of(recipe.nemo_rl_version, cfg).format
    if recipe.nemo_rl_version == "v0.5.0" and fmt == TORCH_SAVE:
        yield Violation(
            ("extra_overrides",),
            "checkpointing.model_save_format=torch_save",
            "NeMo RL v0.5.0's convert_dcp_to_hf.py cannot read the v2 worker's torch_save layout, so the run's model "
            "could not be exported to Hugging Face after training",
            "use checkpointing.model_save_format=safetensors (the default), or a v0.7.0 recipe",
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
    cfg = effective_config(spec, recipe)
    if cfg is None:
        return
    prompts, generations = cfg["grpo.num_prompts_per_step"], cfg["grpo.num_generations_per_prompt"]
    rollout, gbs = prompts * generations, cfg["policy.train_global_batch_size"]
    if rollout % gbs:
        yield Violation(
            ("num_prompts_per_step", "num_generations_per_prompt"),
            spec.num_prompts_per_step,
            f"{prompts} prompts x {generations} generations = "
            f"{rollout} samples per step is not a multiple of train_global_batch_size {gbs}; NeMo RL fails at the "
            "first training step, after the first generation pass",
            f"make prompts x generations a multiple of {gbs} (e.g. num_prompts_per_step="
            f"{_next_multiple(prompts, gbs, generations)}), "
            "or set policy.train_global_batch_size in extra_overrides",
        )


def _next_multiple(prompts: int, gbs: int, generations: int) -> int:
    """The smallest prompt count >= ``prompts`` with prompts x generations a multiple of gbs (no loop: gbs is conf)."""
    step = gbs // math.gcd(gbs, generations)
    return -(-prompts // step) * step


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
    cfg = effective_config(spec, recipe)
    if cfg is None:
        return
    dp = data_parallel(cfg)
    gbs = cfg["policy.train_global_batch_size"]
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
    cfg = effective_config(spec, recipe)
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
    "nemo.override-syntax",
    NEMO,
    "Overrides parse with Hydra's own grammar, one value each",
    example={"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6,1e-5"]},
    counter_example={"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6"]},
)
def override_syntax(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Hydra 1.3's parser (NeMo RL's pin) reads every override; what it refuses, NeMo RL refuses after provisioning."""
    for entry in recipe.entries(spec):
        error = entry.error
        if error is None:
            continue
        if entry.user_given:
            yield Violation(entry.params, entry.shown, f"{entry.params[0]} {error.problem}", error.fix)
        elif entry.params != ("recipe",):
            yield Violation(
                entry.params,
                clip(entry.shown),
                f"{entry.params[0]} cannot be passed to NeMo RL as a literal Hydra value: {error.problem}",
                f"give {entry.params[0]} a plain value of its type, without NUL characters or unpaired surrogates",
            )
        else:
            yield Violation(
                ("recipe",),
                spec.recipe,
                f"the recipe's override {clip(entry.text)} is refused: {error.problem}",
                "fix the recipe file's overrides",
            )


@rule(
    "nemo.override-interpolation",
    NEMO,
    "Extra overrides hold no ${...} interpolation",
    example={"extra_overrides": ["policy.optimizer.kwargs.lr=${oc.env:HF_TOKEN}"]},
    counter_example={"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6"]},
)
def override_interpolation(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """NeMo RL resolves the config in the driver, where the job's secrets are in the environment."""
    for entry in recipe.entries(spec):
        if not entry.user_given or entry.override is None or not entry.override.interpolations():
            continue
        yield Violation(
            entry.params,
            entry.shown,
            f"{entry.override.key} gets a value with ${{...}}, which NeMo RL resolves in the driver "
            "(OmegaConf.to_container(resolve=True)): ${oc.env:...} would copy the job's environment, the HF and "
            "W&B tokens included, into the config, the driver log, W&B and the checkpoint's config.yaml",
            "write the literal value: an override cannot refer to other keys or to the environment",
        )


@rule(
    "nemo.override-keys",
    NEMO,
    "Override keys exist for the pinned version (key=v vs +key=v)",
    example={"extra_overrides": ["+policy.train_global_batch_size=1024"]},
    counter_example={"extra_overrides": ["policy.train_global_batch_size=1024"]},
)
def override_keys(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """Hydra applies each override to NeMo RL's struct config: key=v sets, +key=v adds, ~key deletes."""
    try:
        entries, applied = recipe.entries(spec), recipe.apply(spec)
    except RecipeError:
        return  # the base config itself is broken: nemo.override-syntax or recipe.load says so
    where = f"{recipe.base_config} at NeMo RL {recipe.nemo_rl_version}"
    for failure in applied.failures:
        entry = entries[failure.index]
        assert entry.override is not None
        key = entry.override.key
        if failure.reason == "missing":
            problem = f"{key} does not exist in {where}"
            fix = f"write +{key}=... to add it, or check the key's spelling and the version's layout"
        elif failure.reason == "exists":
            problem = f"{key} already exists in the config, and Hydra's + only adds missing keys"
            fix = f"write {key}=... (or ++{key}=...)"
        elif failure.reason == "delete":
            problem = f"{key} does not exist in {where} or is null, and Hydra's ~ deletes only keys with a value"
            fix = "remove the override"
        else:
            problem = f"Hydra cannot apply it to {where}: {failure.detail}"
            fix = "give a value of the key's shape (a mapping for a section, a list for a list), or check the key"
        params = tuple(dict.fromkeys((*entry.params, "recipe")))
        yield Violation(params, clip(entry.text), problem, fix)
    if applied.resolve_error:
        yield Violation(
            ("extra_overrides", "recipe"),
            [clip(t) for t in spec.extra_overrides],
            f"NeMo RL resolves the config after the overrides, and that fails: {applied.resolve_error}",
            "do not delete or replace a key that another key of the base config refers to with ${...}",
        )


@rule(
    "nemo.override-bound-key",
    NEMO,
    "Extra overrides leave the keys the DAG derives alone, parents included",
    example={"extra_overrides": ["cluster.num_nodes=4"]},
    counter_example={"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6"]},
)
def override_bound_key(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """The cluster, the checkpoint validator and the job must agree; a parent's value or ~ would replace them too.

    Protected keys are :meth:`Recipe.protected_keys`. A second check compares each protected key with and without
    the extra overrides, so no route (an interpolation in the base config, say) can change one unnoticed.
    """
    protected = recipe.protected_keys(spec)
    for entry in recipe.entries(spec):
        override = entry.override
        if not entry.user_given or override is None:
            continue
        hits = [p for p in protected if override.touches(p.key)]
        if hits:
            hit = next((p for p in hits if p.key == override.key), hits[0])
            yield Violation(entry.params, entry.shown, _protected_problem(entry, hit), f"remove it; {hit.fix}")
    base, full = recipe.apply(spec, extra=False).config, recipe.apply(spec).config
    for p in protected:
        changed = sorted(
            k
            for k in set(base) | set(full)
            if (k == p.key or k.startswith(p.key + ".")) and not _same(base.get(k, _ABSENT), full.get(k, _ABSENT))
        )
        if changed:
            yield Violation(
                ("extra_overrides",),
                [clip(t) for t in spec.extra_overrides],
                f"the extra overrides change {changed[0]} indirectly, and it {p.why}",
                f"remove the override that changes it (for example the key it interpolates); {p.fix}",
            )


def _protected_problem(entry: Entry, hit: Protected) -> str:
    override = entry.override
    assert override is not None
    if override.key == hit.key:
        if override.op == "~":
            return f"~{hit.key} deletes {hit.key}, which {hit.why}"
        return f"{hit.key} {hit.why}"
    if hit.key.startswith(override.key + "."):
        action = "deleting it deletes" if override.op == "~" else "setting it replaces"
        return f"{override.key} is a parent of {hit.key} ({action} {hit.key} too), which {hit.why}"
    return f"{override.key} is inside {hit.key}, which {hit.why}"


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    # repr as well: NaN is not equal to itself.
    return type(a) is type(b) and (a == b or repr(a) == repr(b))


@rule(
    "nemo.config-integers",
    NEMO,
    "Sizes in the effective config are positive integers",
    example={"extra_overrides": ["policy.train_global_batch_size=0"]},
    counter_example={"extra_overrides": ["policy.train_global_batch_size=1024"]},
)
def config_integers(spec: RunSpec, recipe: Recipe) -> Iterator[Violation]:
    """NeMo RL divides by these sizes: 0, a float, a string, null or a deleted key fails it in the driver."""
    try:
        cfg, entries = recipe.effective_config(spec), recipe.entries(spec)
    except RecipeError:
        return
    protected = recipe.protected_keys(spec)
    for key in COUNTS:
        if config_count(cfg, key) is not None:
            continue
        setters = [e for e in entries if e.override is not None and e.override.touches(key) and accepted(e, protected)]
        params: tuple[str, ...] = ("recipe",)
        shown: Any = spec.recipe
        if setters and setters[-1].user_given:
            params, shown = setters[-1].params, setters[-1].shown
        elif key in CONF_KEYS:
            params, shown = (CONF_KEYS[key],), cfg.get(key)
        state = f"is {clip(repr(cfg[key]))}" if key in cfg else "is not in the config"
        yield Violation(
            params,
            shown,
            f"{key} {state} in the effective config; NeMo RL computes with it and needs an integer from 1 to "
            f"{MAX_COUNT}",
            f"give {key} a whole number >= 1, or leave it to the recipe",
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
