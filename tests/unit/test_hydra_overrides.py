"""Hydra overrides are exact: what NeMo RL's driver makes of them is what the conf said, and nothing else.

The reference below is NeMo RL's own code path (nemo_rl/utils/config.py parse_hydra_overrides, then
run_grpo*.py, FACTS §16) run with the real hydra-core 1.3.2 and omegaconf 2.3.0 it pins: a struct config,
``OverridesParser.create().parse_overrides``, ``ConfigLoaderImpl._apply_overrides_to_config``, then
``OmegaConf.to_container(resolve=True)``. It does not use the package's own override code.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import random
import shlex

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from nemo_rl_gke.preflight.offline import check_conf, check_spec, rules, validate
from nemo_rl_gke.run.findings import ConfError
from nemo_rl_gke.run.hydra_overrides import RecipeError, hydra_value
from nemo_rl_gke.run.recipes import load_recipe, load_version
from nemo_rl_gke.run.spec import RunSpec

CANARY = "hf_canary_0123456789abcdef"
QWEN = {"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4}
RULES = {r.rule_id: r for r in rules()}


def nemo_rl_resolve(base: dict, overrides: list[str]) -> dict:
    """What NeMo RL's driver does with a config and its command-line overrides."""
    cfg = OmegaConf.create(base)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    return OmegaConf.to_container(cfg, resolve=True)


def nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def job_overrides(recipe_name: str, spec: RunSpec) -> list[str]:
    """The overrides exactly as the job's shell passes them to the script (argv after --config <base>)."""
    recipe = load_recipe(recipe_name)
    argv = shlex.split(recipe.command(spec).splitlines()[-1])
    return argv[argv.index("--config") + 2 :]


# --- Conf strings are literal ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "param", "value", "path"),
    [
        ("gemma3-27b-gsm8k-v0.5.0", "wandb_run_name", "${oc.env:HF_TOKEN}", ("logger", "wandb", "name")),
        ("gemma3-27b-gsm8k-v0.5.0", "checkpoint_dir", "/data/${oc.env:HF_TOKEN}", ("checkpointing", "checkpoint_dir")),
        ("gemma3-27b-gsm8k-v0.5.0", "wandb_project", "p-${oc.env:HF_TOKEN}", ("logger", "wandb", "project")),
        ("qwen2.5-7b-gsm8k-v0.7.0", "wandb_run_name", "'${oc.env:HF_TOKEN}'", ("logger", "wandb", "name")),
        (
            "qwen2.5-7b-gsm8k-v0.7.0",
            "checkpoint_dir",
            "/data/x\\${oc.env:HF_TOKEN}",
            ("checkpointing", "checkpoint_dir"),
        ),
    ],
)
def test_interpolation_in_a_conf_string_stays_literal_in_nemo_rl(
    monkeypatch: pytest.MonkeyPatch, recipe: str, param: str, value: str, path: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    spec = RunSpec.from_conf({**({} if recipe.startswith("gemma") else QWEN), "recipe": recipe, param: value})
    config = nemo_rl_resolve(nested(load_recipe(recipe).base_values), job_overrides(recipe, spec))
    node = config
    for part in path:
        node = node[part]
    assert node == value
    assert CANARY not in json.dumps(config)
    # The preflight's effective config is the same literal text.
    assert load_recipe(recipe).effective_config(spec)[".".join(path)] == value


@pytest.mark.parametrize("value", ["true", "False", "null", "NULL", "1e3", "123", "-7", "0.5", "inf", "nan", "[1,2]"])
def test_conf_strings_keep_their_type(value: str) -> None:
    spec = RunSpec.from_conf({"wandb_run_name": value})
    config = nemo_rl_resolve(nested(load_recipe(spec.recipe).base_values), job_overrides(spec.recipe, spec))
    assert config["logger"]["wandb"]["name"] == value
    assert load_recipe(spec.recipe).effective_config(spec)["logger.wandb.name"] == value


# The characters Hydra's and OmegaConf's grammars treat specially, unicode, and whole tokens an attacker would try.
_ALPHABET = list("\\'\"${}$,=#()[]:@/.-+~?*% \n\t\r!;&|<>^`") + list("abcXYZ019_") + list("é中😀\u200b\u2028\u202e")
_TOKENS = ["${", "\\${", "${oc.env:HF_TOKEN}", "\\", "\\\\", "'", "\\'", "true", "null", "1e3", "???", "}", "${x}"]
ADVERSARIAL = [
    "",
    " ",
    "\\",
    "a\\",
    "a\\\\",
    "'",
    "''",
    "\\'",
    "it's",
    '"',
    "${oc.env:HF_TOKEN}",
    "\\${oc.env:HF_TOKEN}",
    "\\\\${oc.env:HF_TOKEN}",
    "\\\\\\${oc.env:HF_TOKEN}",
    "$${oc.env:HF_TOKEN}",
    "${oc.env:HF_TOKEN",
    "${}",
    "${",
    "$",
    "$\\{x}",
    "${oc.env:HF_TOKEN}\\",
    "'${oc.env:HF_TOKEN}'",
    "true",
    "null",
    "1e3",
    "[1,2]",
    "{a: 1}",
    "???",
    "a,b",
    "a=b",
    "a#b",
    "a(b",
    "choice(a,b)",
    "line\nbreak",
    "trailing newline\n",
    "tab\there",
    "cr\rhere",
    "ünïcödé 中文 😀",
    "\u202eevil",
    " leading and trailing ",
    "x" * 2000,
]


def round_trip_strings(count: int = 2500, seed: int = 20261110) -> list[str]:
    rng = random.Random(seed)
    out = list(ADVERSARIAL)
    for _ in range(count):
        parts = [
            rng.choice(_TOKENS) if rng.random() < 0.2 else rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24))
        ]
        out.append("".join(parts))
    return out


def test_hydra_value_round_trips_every_string_through_hydra_and_omegaconf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    parser = OverridesParser.create()
    strings = round_trip_strings()
    assert len(strings) >= 2000
    for s in strings:
        text = f"k={hydra_value(s)}"
        (parsed,) = parser.parse_overrides([text])
        if "${" not in s:
            # Hydra hands OmegaConf exactly the string (a string with ${ must reach it escaped: see below).
            assert parsed.value() == s, (s, text)
        assert isinstance(parsed.value(), str), (s, text)
        cfg = OmegaConf.create({"k": "before", "other": 1})
        OmegaConf.set_struct(cfg, True)
        ConfigLoaderImpl._apply_overrides_to_config([parsed], cfg)
        assert OmegaConf.to_container(cfg, resolve=True)["k"] == s, (s, text)


@pytest.mark.parametrize("value", ["a\x00b", "\ud800", "x\udfffy"])
def test_unrepresentable_strings_are_refused(value: str) -> None:
    with pytest.raises(RecipeError):
        hydra_value(value)
    # The conf's shape check refuses it first (control characters and unpaired surrogates are never printable) ...
    _, findings = check_conf({"wandb_run_name": value})
    assert [(f.param, f.rule_id) for f in findings] == [("wandb_run_name", "conf.printable")]
    # ... and a spec that skipped that check still cannot carry it to the command line.
    spec = dataclasses.replace(RunSpec(), wandb_run_name=value)
    (finding,) = [f for f in check_spec(spec) if f.rule_id == "nemo.override-syntax"]
    assert finding.param == "wandb_run_name" and "cannot be passed to NeMo RL" in finding.rule and finding.fix


def test_typed_values_are_written_as_hydra_literals() -> None:
    parser = OverridesParser.create()
    for value in (True, False, None, 0, 8, -3, 0.9, 1e-06, 1e20, 3e-07):
        (parsed,) = parser.parse_overrides([f"k={hydra_value(value)}"])
        assert parsed.value() == value and type(parsed.value()) is type(value)
    for bad in (float("nan"), float("inf"), [1], {"a": 1}):
        with pytest.raises(RecipeError):
            hydra_value(bad)


# --- Extra overrides: parsed by Hydra, refused when they would do harm ------------------------------------------


REFUSED = [
    # Protected keys, set, deleted, replaced through a parent or reached from below.
    ("cluster={num_nodes:1}", "nemo.override-bound-key"),
    ("++cluster={num_nodes:1}", "nemo.override-bound-key"),
    ("~checkpointing", "nemo.override-bound-key"),
    ("checkpointing=null", "nemo.override-bound-key"),
    ("checkpointing={checkpoint_dir:/tmp/elsewhere}", "nemo.override-bound-key"),
    ("policy=null", "nemo.override-bound-key"),
    ("~policy", "nemo.override-bound-key"),
    ("+cluster.x=1", "nemo.override-bound-key"),
    ("~cluster.gpus_per_node", "nemo.override-bound-key"),
    ("grpo.max_num_steps=5", "nemo.override-bound-key"),
    ("policy.model_name=someone/else", "nemo.override-bound-key"),
    ("checkpointing.enabled=false", "nemo.override-bound-key"),
    ("+data.train_data_path=/tmp/x", "nemo.override-bound-key"),
    ("data.input_key=text", "nemo.override-bound-key"),
    # Keys that would pick code or a host next to the job's secrets.
    ("policy.tokenizer.name=attacker/evil-tokenizer", "nemo.override-bound-key"),
    ("policy.tokenizer={name:attacker/evil}", "nemo.override-bound-key"),
    ("+logger.wandb.settings={base_url:'https://attacker.example'}", "nemo.override-bound-key"),
    ("logger.wandb.entity=someone", "nemo.override-bound-key"),
    ("logger={}", "nemo.override-bound-key"),
    # What Hydra's grammar refuses, sweeps, config groups and packages.
    ("policy.optimizer.kwargs.lr=1e-6,1e-5", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=choice(1e-6,1e-5)", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=range(1,3)", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=glob(*)", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=a=b", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=a#b", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=[1,", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr=é", "nemo.override-syntax"),
    ("policy.optimizer@pkg=1", "nemo.override-syntax"),
    ("hydra/launcher=basic", "nemo.override-syntax"),
    ("=1", "nemo.override-syntax"),
    (" policy.optimizer.kwargs.lr=1", "nemo.override-syntax"),
    ("policy.optimizer.kwargs.lr", "nemo.override-syntax"),
    # Interpolations, quoted or smuggled through Hydra's escapes, in lists and dict keys.
    ("policy.optimizer.kwargs.lr=${oc.env:HF_TOKEN}", "nemo.override-interpolation"),
    ("+policy.note='${oc.env:HF_TOKEN}'", "nemo.override-interpolation"),
    ("+policy.note=x${policy.model_name}", "nemo.override-interpolation"),
    ("+policy.note=$\\{oc.env:HF_TOKEN\\}", "nemo.override-interpolation"),
    ("+policy.note=[$\\{oc.env:WANDB_API_KEY\\}]", "nemo.override-interpolation"),
    ("+policy.note={$\\{oc.env:HF_TOKEN\\}:1}", "nemo.override-interpolation"),
    ("+policy.note='\\${oc.env:HF_TOKEN}'", "nemo.override-interpolation"),
    # Sizes NeMo RL computes with.
    ("policy.train_global_batch_size=0", "nemo.config-integers"),
    ("policy.train_global_batch_size=nan", "nemo.config-integers"),
    ("policy.train_global_batch_size=1e3", "nemo.config-integers"),
    ("policy.train_global_batch_size=true", "nemo.config-integers"),
    ("policy.train_global_batch_size=null", "nemo.config-integers"),
    ("~policy.train_global_batch_size", "nemo.config-integers"),
    ("policy.dtensor_cfg.context_parallel_size=0", "nemo.config-integers"),
]


@pytest.mark.parametrize(("override", "rule_id"), REFUSED)
def test_harmful_extra_overrides_are_refused_naming_the_item(override: str, rule_id: str) -> None:
    spec, findings = check_conf({"extra_overrides": ["policy.optimizer.kwargs.lr=1e-6", override]})
    assert spec is None
    matching = [f for f in findings if f.rule_id == rule_id]
    assert matching, [str(f) for f in findings]
    finding = matching[0]
    assert finding.param == "extra_overrides[1]"
    assert finding.value == override and finding.rule and finding.fix


def test_a_long_override_is_echoed_truncated() -> None:
    override = "policy.optimizer.kwargs.lr=" + "1," * 450 + "1"  # within the 1024 characters an item may have
    _, findings = check_conf({"extra_overrides": [override]})
    (finding,) = [f for f in findings if f.rule_id == "nemo.override-syntax"]
    assert (
        finding.param == "extra_overrides[0]" and len(finding.value) <= 120 and override.startswith(finding.value[:-3])
    )


@pytest.mark.parametrize(
    "override",
    ["policy.optimizer.kwargs.lr=1e-6,1e-5", "policy.optimizer.kwargs.lr=a=b", "cluster={num_nodes:1}"],
)
def test_refused_at_validate_and_never_on_the_command_line(override: str) -> None:
    conf = {"extra_overrides": [override]}
    with pytest.raises(ConfError):
        validate(conf)
    with pytest.raises(RecipeError):
        load_recipe("gemma3-27b-gsm8k-v0.5.0").command(RunSpec.from_conf(conf))


@pytest.mark.parametrize(
    ("conf", "override"),
    [
        ({}, "policy.optimizer.kwargs.lr=1e-6"),
        ({}, "+policy.note='a,b'"),
        ({}, "+policy.note='a=b # c'"),
        ({}, "logger.tensorboard_enabled=true"),
        ({}, "++policy.optimizer.kwargs.weight_decay=0.1"),
        ({}, "grpo.val_period=5"),
        # The README's fix for nemo.batch-multiple: the global batch is the recipe's, so it stays overridable.
        ({"num_prompts_per_step": 12}, "policy.train_global_batch_size=384"),
        (QWEN, "policy.logprob_batch_size=1"),
        (
            {"recipe": "local-cpu-gsm8k", "worker_replicas": 1, "colocated": True, "dtensor_tp": 1, "vllm_tp": 1},
            "data.ground_truth=full_solution",
        ),
    ],
)
def test_ordinary_extra_overrides_pass(conf: dict, override: str) -> None:
    spec, findings = check_conf({**conf, "extra_overrides": [override]})
    assert findings == [] and spec is not None, [str(f) for f in findings]
    overrides = job_overrides(spec.recipe, spec)
    assert overrides[-1] == override


def test_effective_config_has_the_types_hydra_gives() -> None:
    # YAML 1.1 (the old reading) makes 0x10 16, yes/on True and 1e3 a string; Hydra does the opposite.
    extra = ["+policy.a=0x10", "+policy.b=yes", "+policy.c=1e3", "+policy.d=on", "+policy.e='1e3'", "+policy.f=1_000"]
    spec = RunSpec.from_conf({"extra_overrides": extra})
    cfg = load_recipe(spec.recipe).effective_config(spec)
    assert [cfg[f"policy.{k}"] for k in "abcdef"] == ["0x10", "yes", 1000.0, "on", "1e3", 1000]
    reference = nemo_rl_resolve(nested(load_recipe(spec.recipe).base_values), job_overrides(spec.recipe, spec))
    assert [reference["policy"][k] for k in "abcdef"] == [cfg[f"policy.{k}"] for k in "abcdef"]


def test_protected_keys_cover_every_key_the_recipes_derive_from_the_run_spec() -> None:
    for name, conf in [
        ("gemma3-27b-gsm8k-v0.5.0", {}),
        ("qwen2.5-7b-gsm8k-v0.7.0", QWEN),
        ("local-cpu-gsm8k", {"worker_replicas": 1, "colocated": True, "dtensor_tp": 1, "vllm_tp": 1}),
    ]:
        spec = RunSpec.from_conf({**conf, "recipe": name})
        recipe = load_recipe(name)
        rendered = {e.override.key for e in recipe.entries(spec) if e.reads_spec}
        assert "cluster.num_nodes" in rendered and "checkpointing.checkpoint_dir" in rendered
        texts = set()
        for key in rendered | {"policy.model_name"}:
            parts = key.split(".")
            texts |= {f"{key}=1", f"~{key}", f"++{key}=1"}
            for depth in range(1, len(parts)):
                parent = ".".join(parts[:depth])
                texts |= {f"{parent}=null", f"~{parent}", f"++{parent}={{}}"}
        for text in sorted(texts):
            findings = list(
                RULES["nemo.override-bound-key"].run(
                    RunSpec.from_conf({**conf, "recipe": name, "extra_overrides": [text]}), recipe
                )
            )
            assert findings, f"{name}: {text} was not refused"


def test_a_protected_key_changed_through_an_interpolation_is_refused() -> None:
    # logprob_batch_size is ${policy.train_micro_batch_size} at v0.7.0: were it protected, changing the micro batch
    # would change it without touching it.
    recipe = dataclasses.replace(load_recipe(QWEN["recipe"]), protected=("policy.logprob_batch_size",))
    spec = RunSpec.from_conf({**QWEN, "extra_overrides": ["policy.train_micro_batch_size=4"]})
    (finding,) = RULES["nemo.override-bound-key"].run(spec, recipe)
    assert "change policy.logprob_batch_size indirectly" in finding.rule


def test_a_deleted_interpolation_source_is_refused() -> None:
    _, findings = check_conf({**QWEN, "extra_overrides": ["~grpo.normalize_rewards"]})
    (finding,) = findings
    assert (
        finding.rule_id == "nemo.override-keys"
        and "Interpolation key 'grpo.normalize_rewards' not found" in finding.rule
    )


@pytest.mark.parametrize(
    "override",
    [
        "policy.x=" + "[" * 2000 + "]" * 2000,
        "policy.train_global_batch_size=" + "9" * 4000,
        "policy.train_global_batch_size=1e400",
        "policy.train_global_batch_size=[1]",
        "policy.train_global_batch_size=abc",
        "policy.train_global_batch_size=-5",
        "policy.generation.vllm_cfg.pipeline_parallel_size=0.5",
        "policy.scheduler=5",
        "~policy.optimizer",
        "+" + "a." * 1500 + "b=1",
        "x" * 10000,
        "policy.optimizer.kwargs.lr=\x00",
    ],
    ids=lambda override: repr(override[:40]),
)
def test_validate_is_total_on_hostile_overrides(override: str) -> None:
    spec, findings = check_conf({"extra_overrides": [override]})
    assert (spec is None) == bool(findings)
    for finding in findings:
        assert finding.param and finding.rule and finding.fix
        assert len(json.dumps(finding.value)) < 400


def test_a_huge_global_batch_gets_a_closed_form_fix() -> None:
    _, findings = check_conf({"extra_overrides": ["policy.train_global_batch_size=999983"]})
    (finding,) = [f for f in findings if f.rule_id == "nemo.batch-multiple"]
    assert "num_prompts_per_step=999983" in finding.fix


def test_the_installed_parser_is_the_one_the_recipes_nemo_rl_pins() -> None:
    for version in ("v0.5.0", "v0.7.0"):
        facts = load_version(version)
        assert facts.hydra == importlib.metadata.version("hydra-core")
        assert facts.omegaconf == importlib.metadata.version("omegaconf")
