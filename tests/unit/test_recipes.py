"""Recipes: loading, the rendered command, the effective config, and the GSM8K preparation step."""

from __future__ import annotations

import importlib.util
import json
import shlex

import pytest

from nemo_rl_gke.run.hydra_overrides import Override, RecipeError, hydra_value
from nemo_rl_gke.run.paths import recipe_names
from nemo_rl_gke.run.recipes import load_recipe, load_version
from nemo_rl_gke.run.spec import RunSpec
from tests.paths import ROOT

# The tutorial's overrides (gemma3-27b-gsm8k.sh) and what the recipe renders for each, for the default spec.
TUTORIAL_OVERRIDES = {
    "cluster.num_nodes=2": "cluster.num_nodes=2",
    "cluster.gpus_per_node=8": "cluster.gpus_per_node=8",
    "grpo.max_num_steps=10": "grpo.max_num_steps=10",
    "checkpointing.checkpoint_dir=/data/nemo_rl_gemma3_27b_3_17": (
        "checkpointing.checkpoint_dir=/data/nemo_rl_gemma3_27b_3_17"
    ),
    "data.dataset_name=ResponseDataset": "data.dataset_name=ResponseDataset",
    # openai/gsm8k 'main' prepared as JSONL on Lustre: v0.5.0 ignores +data.subset (the tutorial sed-patched it)
    "+data.train_data_path=openai/gsm8k": "+data.train_data_path=/data/datasets/gsm8k_main/train.jsonl",
    "+data.val_data_path=openai/gsm8k": "+data.val_data_path=/data/datasets/gsm8k_main/test.jsonl",
    '+data.input_key="question"': "+data.input_key=question",
    '+data.output_key="answer"': "+data.output_key=answer",
    "logger.tensorboard_enabled=False": "logger.tensorboard_enabled=false",
    "logger.wandb_enabled=True": "logger.wandb_enabled=true",
    "logger.wandb.name='nemo_rl_gemma3_27b_3_17'": "logger.wandb.name=nemo_rl_gemma3_27b_3_17",
    "grpo.num_prompts_per_step=16": "grpo.num_prompts_per_step=16",
    "grpo.num_generations_per_prompt=32": "grpo.num_generations_per_prompt=32",
    "policy.generation.colocated.enabled=False": "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.num_nodes=1": "policy.generation.colocated.resources.num_nodes=1",
    "policy.generation.colocated.resources.gpus_per_node=8": "policy.generation.colocated.resources.gpus_per_node=8",
    "policy.generation.vllm_cfg.tensor_parallel_size=8": "policy.generation.vllm_cfg.tensor_parallel_size=8",
    "policy.generation.vllm_cfg.gpu_memory_utilization=0.9": "policy.generation.vllm_cfg.gpu_memory_utilization=0.9",
    "policy.dtensor_cfg.tensor_parallel_size=8": "policy.dtensor_cfg.tensor_parallel_size=8",
}
# Tutorial overrides with no counterpart: JSONL files have a single 'train' split, and v0.5.0 ignores subset.
DROPPED = {"+data.val_split=test", "+data.train_split=train", '+data.subset="main"'}


def test_every_shipped_recipe_loads() -> None:
    assert set(recipe_names()) == {"gemma3-27b-gsm8k-v0.5.0", "qwen2.5-7b-gsm8k-v0.7.0", "local-cpu-gsm8k"}
    for name in recipe_names():
        recipe = load_recipe(name)
        assert recipe.description and recipe.overrides
        assert recipe.version.version == recipe.nemo_rl_version


def test_tutorial_recipe_reproduces_the_tutorial_overrides() -> None:
    rendered = [o.text for o in load_recipe("gemma3-27b-gsm8k-v0.5.0").render_overrides(RunSpec())]
    assert rendered == list(TUTORIAL_OVERRIDES.values())
    assert len(TUTORIAL_OVERRIDES) + len(DROPPED) == 23  # the tutorial script passes 23 overrides


def test_tutorial_effective_config() -> None:
    cfg = load_recipe("gemma3-27b-gsm8k-v0.5.0").effective_config(RunSpec())
    assert cfg["policy.model_name"] == "google/gemma-3-27b-it"
    assert cfg["cluster.num_nodes"] == 2 and cfg["cluster.gpus_per_node"] == 8
    assert cfg["policy.train_global_batch_size"] == 512
    assert cfg["policy.dtensor_cfg.tensor_parallel_size"] == 8
    assert cfg["policy.generation.colocated.enabled"] is False
    assert cfg["policy.generation.vllm_cfg.gpu_memory_utilization"] == 0.9
    assert cfg["data.train_data_path"] == "/data/datasets/gsm8k_main/train.jsonl"


def test_command_pins_the_script_and_never_pulls() -> None:
    command = load_recipe("gemma3-27b-gsm8k-v0.5.0").command(RunSpec())
    assert "git pull" not in command and "sed " not in command
    last = shlex.split(command.splitlines()[-1])
    assert last[:5] == ["uv", "run", "python", "examples/run_grpo_math.py", "--config"]
    assert command.splitlines()[2] == "cd /opt/nemo-rl"


def test_v07_recipe_uses_the_split_data_layout() -> None:
    recipe = load_recipe("qwen2.5-7b-gsm8k-v0.7.0")
    assert recipe.entrypoint == "examples/run_grpo.py" and load_version("v0.7.0").data_layout == "split"
    cfg = recipe.effective_config(RunSpec.from_conf({"recipe": recipe.name, "dtensor_tp": 4, "vllm_tp": 4}))
    assert cfg["data.train.dataset_name"] == "gsm8k" and cfg["data.validation.split"] == "test"


@pytest.mark.parametrize(
    ("text", "op", "key", "value"),
    [
        ("a.b=1", "", "a.b", 1),
        ("+a.b=x y", "+", "a.b", "x y"),
        ("++a=true", "++", "a", True),
        ("~a.b", "~", "a.b", None),
        ("a=0.9", "", "a", 0.9),
        # Typed by Hydra's grammar, not YAML's: 1e3 is a float, 0x10 and yes are strings, quotes keep strings.
        ("a=1e3", "", "a", 1000.0),
        ("a='1e3'", "", "a", "1e3"),
        ("a=0x10", "", "a", "0x10"),
        ("a=yes", "", "a", "yes"),
        ("a=[1,'b']", "", "a", [1, "b"]),
        ("~a=3", "~", "a", 3),
    ],
)
def test_override_parsing(text: str, op: str, key: str, value: object) -> None:
    parsed = Override.parse(text)
    assert (parsed.op, parsed.key, parsed.value) == (op, key, value)


@pytest.mark.parametrize(
    "bad", ["=1", "a b=1", "a.b", "+", "a=b,c", "a=choice(1,2)", "a=x#y", "a=x=y", "a@pkg=1", "group/option=x", " a=1"]
)
def test_bad_overrides_are_refused(bad: str) -> None:
    with pytest.raises(RecipeError):
        Override.parse(bad)


def test_hydra_values() -> None:
    assert [hydra_value(v) for v in (True, False, None, 8, 0.9, "a/b-c")] == [
        "true",
        "false",
        "null",
        "8",
        "0.9",
        "a/b-c",
    ]
    assert hydra_value("it's a test") == "'it\\'s a test'"
    # Strings Hydra would type or OmegaConf would resolve are quoted and escaped (tests/unit/test_hydra_overrides.py
    # proves the round trip).
    assert [hydra_value(v) for v in ("true", "1e3", "${x}", "a\\")] == ["'true'", "'1e3'", "'\\${x}'", "'a\\\\'"]


def test_missing_recipe_is_a_recipe_error() -> None:
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe("no-such-recipe")


def _gsm8k_module():
    spec = importlib.util.spec_from_file_location("gsm8k_to_jsonl", ROOT / "include/recipes/scripts/gsm8k_to_jsonl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gsm8k_preparation_keeps_only_the_final_answer(tmp_path) -> None:
    module = _gsm8k_module()
    records = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "How many grams in 1,200 kg?", "answer": "1200 * 1000 = 1200000\n#### 1,200,000"},
    ]
    path = tmp_path / "train.jsonl"
    assert module.write_jsonl(module.to_rows(records), path) == 2
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "7"},
        {"question": "How many grams in 1,200 kg?", "answer": "1200000"},
    ]
    with pytest.raises(ValueError, match="without '####'"):
        module.final_answer("no marker")


def test_the_effective_config_reads_values_and_interpolations_as_nemo_rl_does() -> None:
    # OmegaConf's loader (NeMo RL's OmegaConf.load) reads 3e-07 as a float; plain YAML 1.1 kept it a string.
    recipe = load_recipe("qwen2.5-7b-gsm8k-v0.7.0")
    spec = RunSpec.from_conf({"recipe": recipe.name, "dtensor_tp": 2, "vllm_tp": 2})
    config = recipe.effective_config(spec)
    assert config["policy.optimizer.kwargs.lr"] == pytest.approx(3e-07)
    assert isinstance(config["policy.optimizer.kwargs.lr"], float)
    assert config["policy.dynamic_batching.train_mb_tokens"] == 4096
    # ${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}} follows an override of either,
    # with NeMo RL's own "mul" resolver, instead of keeping the base config's value.
    extra = ["policy.max_total_sequence_length=8192", "policy.train_micro_batch_size=2"]
    applied = recipe.apply(RunSpec.from_conf({**spec.to_conf(), "extra_overrides": extra}), extra=True).config
    assert applied["policy.dynamic_batching.train_mb_tokens"] == 16384
    assert applied["policy.sequence_packing.logprob_mb_tokens"] == 8192 * applied["policy.logprob_batch_size"]
