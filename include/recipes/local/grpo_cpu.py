"""A real GRPO fine-tune small enough for a CPU: the local sandbox's stand-in for NeMo RL's ``run_grpo_math.py``.

It runs as a Ray job entrypoint exactly like NeMo RL (``python grpo_cpu.py --config config.yaml key=value ...``) and
behaves like it where the DAG can see it:

* the config uses NeMo RL's keys and Hydra override semantics (``key=v`` sets, ``+key=v`` adds, ``++key=v`` either,
  ``~key`` deletes); a bad config or override exits with status 2 and a message naming the key;
* the data are GSM8K-format arithmetic word problems generated from the seed (``question``, and an ``answer`` with
  GSM8K's ``<<a+b=c>>`` calculator annotation and a last line ``#### N``), some with an irrelevant fact;
* the policy is a small GRU encoder-decoder trained from scratch: it writes the calculation (``3 + 4``) token by
  token, copying numbers from the question; the calculator completes it (``3 + 4 = 7``) and the grader compares the
  final answer with the ground truth (reward 1 or 0);
* the algorithm is GRPO: a group of sampled responses per prompt, group-relative advantages, NeMo RL's clipped
  policy-gradient loss with a k3 KL penalty to the frozen initial policy, Adam;
* stdout carries NeMo RL v0.5.0's markers (step header, Training Results, Timing, Performance Metrics, Validation
  Results, ``Saving checkpoint for step N...``), flushed line by line;
* checkpoints use NeMo RL's layout: ``step_N/{config.yaml, training_info.json, train_dataloader.pt,
  policy/{weights,optimizer}/ (torch.distributed.checkpoint, one shard per training rank), policy/tokenizer/}``,
  written as ``tmp_step_N`` and renamed, and a run resumes from the highest ``step_N``;
* ``checkpointing.checkpoint_must_save_by`` ("DD:HH:MM:SS") works as NeMo RL's ``TimeoutChecker``
  (``nemo_rl/utils/timer.py``): the clock starts with the training loop, and once the elapsed time plus the mean
  step time reaches it, the step saves a checkpoint and training stops with NeMo RL's "Timeout has been reached"
  line (exit status 0).

Run as a Ray job, it puts work on the RayCluster's GPU workers as NeMo RL does: one actor per node
(``cluster.num_nodes``), each holding its node's ``cluster.gpus_per_node`` Ray GPUs, grades every step's responses. So a
worker node that is lost fails the step with Ray's own ``ActorDiedError`` / ``ActorUnavailableError`` and the job ends
FAILED, and GPUs that are short at start fail it after NeMo RL's placement retries with ``ResourceInsufficientError``.
Run outside Ray (no ``RAY_ADDRESS``), it grades in process.

``sandbox.hang_after_step=N`` (the sandbox's own key, not NeMo RL's) makes the trainer hang after step N's results
are printed, as a job stuck in NCCL or generation does: it prints nothing more and never exits until stopped.
``sandbox.step_delay_s=S`` (also the sandbox's) sleeps S seconds after each step's results: a slower job, no more CPU.
``sandbox.setup_delay_s=S`` sleeps S seconds in the setup, before NeMo RL's ``SETUP COMPLETE`` block and the deadline
clock that starts after it: a large model's load, as slow as a test needs it.

``data.ground_truth=full_solution`` hands the grader the whole worked solution instead of the ``#### N`` number, which
reproduces the tutorial's bug: no answer ever matches, every reward is 0, and GRPO learns nothing.

Only the standard library, torch and PyYAML are used, so it runs in any image that has torch.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib
import json
import math
import os
import random
import re
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

# The policy's Hugging Face model sits beside this file in the job's working_dir (the recipe's files).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from modeling_tiny_policy import TinyPolicyConfig, TinyPolicyForCausalLM

PROG = "grpo_cpu.py"
GROUND_TRUTH_MODES = ("final_answer", "full_solution")
# What checkpointing.metric_name may name after "val:" / "train:" (the keys validate() and train_step() return).
VAL_METRICS = ("accuracy", "avg_length")
TRAIN_METRICS = ("loss", "grad_norm", "gen_kl_error", "reward", "mean_gen_tokens_per_sample")
_OVERRIDE = re.compile(
    r"^(?P<op>\+\+|\+|~)?(?P<key>[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*)(?:=(?P<value>.*))?$"
)
_STEP_DIR = re.compile(r"step_(\d+)")
# NeMo RL's weights_path and optimizer_path under step_N (grpo.py: os.path.join(checkpoint_path, "policy", ...)).
WEIGHTS = Path("policy") / "weights"
OPTIMIZER = Path("policy") / "optimizer"
# Hydra keeps "00:03:45:00" a string; PyYAML (YAML 1.1) would read it as a base-60 integer.
_COLON_NUMBERS = re.compile(r"\d+(?::\d+)+")
_MISSING = object()


class ConfigError(ValueError):
    """The config or an override is invalid; the message names the key."""


# ==============================================================================================================
# Config and Hydra-style overrides
# ==============================================================================================================


def parse_override_value(raw: str) -> Any:
    """Type an override value the way Hydra does: a YAML scalar, or a quoted string with ``\\`` escapes."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", raw[1:-1])
    if raw == "":
        return ""
    if _COLON_NUMBERS.fullmatch(raw):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_override(config: dict[str, Any], text: str) -> None:
    """Apply one Hydra override to ``config`` in place; raises :class:`ConfigError` the way Hydra would refuse it."""
    match = _OVERRIDE.match(text.strip())
    if not match or (match["value"] is None and match["op"] != "~"):
        raise ConfigError(f"{text!r} is not an override (key=value, +key=value, ++key=value or ~key)")
    op, key = match["op"] or "", match["key"]
    *parents, leaf = key.split(".")
    node: Any = config
    for depth, part in enumerate(parents):
        child = node.get(part, _MISSING)
        if child is _MISSING and op in ("+", "++"):
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parents[: depth + 1])
            raise ConfigError(f"could not override '{key}': '{where}' is not in the config or is not a mapping")
        node = child
    exists = leaf in node
    if op == "~":
        if not exists:
            raise ConfigError(f"could not delete '{key}': the key is not in the config")
        if match["value"] is not None and node[leaf] != parse_override_value(match["value"]):
            raise ConfigError(f"could not delete '{key}': its value is {node[leaf]!r}, not {match['value']!r}")
        del node[leaf]
        return
    if op == "" and not exists:
        raise ConfigError(f"could not override '{key}': the key is not in the config (use +{key}=... to add it)")
    if op == "+" and exists:
        raise ConfigError(f"could not add '{key}': the key is already in the config (use {key}=... to set it)")
    node[leaf] = parse_override_value(match["value"])


def load_config(path: Path, overrides: list[str]) -> dict[str, Any]:
    """The base config at ``path`` with ``overrides`` applied in order."""
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"the config {path} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"the config {path} is not a mapping")
    for text in overrides:
        apply_override(config, text)
    return config


def _get(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"'{key}' is missing from the config")
        node = node[part]
    return node


def _int(config: dict[str, Any], key: str, minimum: int) -> int:
    value = _get(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _optional_int(config: dict[str, Any], key: str, minimum: int) -> int | None:
    return None if _get(config, key) is None else _int(config, key, minimum)


def _float(config: dict[str, Any], key: str, minimum: float, *, strict: bool = False) -> float:
    value = _get(config, key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < minimum
        or (strict and value == minimum)
    ):
        raise ConfigError(f"'{key}' must be a number {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _bool(config: dict[str, Any], key: str) -> bool:
    value = _get(config, key)
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """The checked, typed values the trainer uses, read from the effective config."""

    num_prompts: int
    num_generations: int
    max_num_steps: int
    max_num_epochs: int
    seed: int
    val_period: int
    normalize_rewards: bool
    kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float
    force_on_policy_ratio: bool
    checkpointing: bool
    checkpoint_dir: Path
    save_period: int
    metric_name: str | None
    higher_is_better: bool
    keep_top_k: int | None
    global_batch_size: int
    lr: float
    max_grad_norm: float
    hidden_size: int
    max_new_tokens: int
    ground_truth: str
    max_number: int
    distractor_prob: float
    num_train_samples: int
    num_val_samples: int
    total_gpus: int
    training_ranks: int
    generation_gpus: int
    must_save_by_s: int | None = None
    hang_after_step: int | None = None
    step_delay_s: float = 0.0
    setup_delay_s: float = 0.0
    v2: bool = False
    model_save_format: str | None = None
    save_consolidated: bool = False


def training_world(config: dict[str, Any]) -> tuple[int, int, int]:
    """(all GPUs, training ranks, generation GPUs) as NeMo RL v0.5.0 splits the cluster."""
    nodes = _int(config, "cluster.num_nodes", 1)
    gpus_per_node = _int(config, "cluster.gpus_per_node", 1)
    total = nodes * gpus_per_node
    if _bool(config, "policy.generation.colocated.enabled"):
        return total, total, total
    gen_nodes = _optional_int(config, "policy.generation.colocated.resources.num_nodes", 1)
    gen_gpus = _optional_int(config, "policy.generation.colocated.resources.gpus_per_node", 1)
    if nodes == 1:
        if gen_gpus is None or gen_gpus >= gpus_per_node:
            raise ConfigError(
                f"'policy.generation.colocated.resources.gpus_per_node' must be set below cluster.gpus_per_node "
                f"({gpus_per_node}) when generation is not colocated on one node, got {gen_gpus!r}"
            )
        if gen_nodes not in (None, 1):
            raise ConfigError(
                f"'policy.generation.colocated.resources.num_nodes' must be 1 or null on one node, got {gen_nodes!r}"
            )
        return total, gpus_per_node - gen_gpus, gen_gpus
    if gen_nodes is None or gen_nodes >= nodes:
        raise ConfigError(
            f"'policy.generation.colocated.resources.num_nodes' must be set below cluster.num_nodes ({nodes}) "
            f"when generation is not colocated, got {gen_nodes!r}"
        )
    if gen_gpus != gpus_per_node:
        raise ConfigError(
            f"'policy.generation.colocated.resources.gpus_per_node' must equal cluster.gpus_per_node "
            f"({gpus_per_node}) when generation has nodes of its own, got {gen_gpus!r}"
        )
    return total, (nodes - gen_nodes) * gpus_per_node, gen_nodes * gen_gpus


def read_settings(config: dict[str, Any]) -> Settings:
    """Check the effective config and return the values the trainer uses; raises :class:`ConfigError`."""
    total, ranks, gen_gpus = training_world(config)
    model_parallel = _int(config, "policy.dtensor_cfg.tensor_parallel_size", 1) * _int(
        config, "policy.dtensor_cfg.context_parallel_size", 1
    )
    if ranks % model_parallel:
        raise ConfigError(
            f"'policy.dtensor_cfg.tensor_parallel_size' x context_parallel_size ({model_parallel}) must divide the "
            f"{ranks} training ranks"
        )
    num_prompts = _int(config, "grpo.num_prompts_per_step", 1)
    num_generations = _int(config, "grpo.num_generations_per_prompt", 2)
    gbs = _int(config, "policy.train_global_batch_size", 1)
    rollout = num_prompts * num_generations
    if rollout % gbs:
        raise ConfigError(
            f"'policy.train_global_batch_size' ({gbs}) must divide num_prompts_per_step x "
            f"num_generations_per_prompt ({rollout})"
        )
    if gbs % (ranks // model_parallel):
        raise ConfigError(
            f"'policy.train_global_batch_size' ({gbs}) must be divisible by the data-parallel size "
            f"{ranks // model_parallel}"
        )
    metric_name = _get(config, "checkpointing.metric_name")
    known = [f"val:{m}" for m in VAL_METRICS] + [f"train:{m}" for m in TRAIN_METRICS]
    if metric_name is not None and metric_name not in known:
        raise ConfigError(f"'checkpointing.metric_name' must be null or one of {', '.join(known)}, got {metric_name!r}")
    ground_truth = _get(config, "data.ground_truth")
    if ground_truth not in GROUND_TRUTH_MODES:
        raise ConfigError(f"'data.ground_truth' must be one of {', '.join(GROUND_TRUTH_MODES)}, got {ground_truth!r}")
    checkpoint_dir = _get(config, "checkpointing.checkpoint_dir")
    if not isinstance(checkpoint_dir, str) or not checkpoint_dir:
        raise ConfigError(f"'checkpointing.checkpoint_dir' must be a path, got {checkpoint_dir!r}")
    settings = Settings(
        num_prompts=num_prompts,
        num_generations=num_generations,
        max_num_steps=_int(config, "grpo.max_num_steps", 1),
        max_num_epochs=_int(config, "grpo.max_num_epochs", 1),
        seed=_int(config, "grpo.seed", 0),
        val_period=_int(config, "grpo.val_period", 0),
        normalize_rewards=_bool(config, "grpo.normalize_rewards"),
        kl_penalty=_float(config, "loss_fn.reference_policy_kl_penalty", 0.0),
        ratio_clip_min=_float(config, "loss_fn.ratio_clip_min", 0.0),
        ratio_clip_max=_float(config, "loss_fn.ratio_clip_max", 0.0),
        force_on_policy_ratio=_bool(config, "loss_fn.force_on_policy_ratio"),
        checkpointing=_bool(config, "checkpointing.enabled"),
        checkpoint_dir=resolve_data_path(checkpoint_dir),
        save_period=_int(config, "checkpointing.save_period", 1),
        metric_name=metric_name,
        higher_is_better=_bool(config, "checkpointing.higher_is_better"),
        keep_top_k=_optional_int(config, "checkpointing.keep_top_k", 1),
        global_batch_size=gbs,
        lr=_float(config, "policy.optimizer.lr", 0.0, strict=True),
        max_grad_norm=_float(config, "policy.max_grad_norm", 0.0, strict=True),
        hidden_size=_int(config, "policy.hidden_size", 1),
        max_new_tokens=_int(config, "policy.generation.max_new_tokens", 1),
        ground_truth=ground_truth,
        max_number=_int(config, "data.max_number", 1),
        distractor_prob=_float(config, "data.distractor_prob", 0.0),
        num_train_samples=_int(config, "data.num_train_samples", num_prompts),
        num_val_samples=_int(config, "data.num_val_samples", 1),
        total_gpus=total,
        training_ranks=ranks,
        generation_gpus=gen_gpus,
        must_save_by_s=_duration(config, "checkpointing.checkpoint_must_save_by"),
        hang_after_step=_optional_int(config, "sandbox.hang_after_step", 1),
        step_delay_s=_float(config, "sandbox.step_delay_s", 0.0) if _get(config, "sandbox.step_delay_s") else 0.0,
        setup_delay_s=_float(config, "sandbox.setup_delay_s", 0.0) if _get(config, "sandbox.setup_delay_s") else 0.0,
        v2=_bool(config, "policy.dtensor_cfg._v2"),
        model_save_format=_save_format(config),
        save_consolidated=_bool(config, "checkpointing.save_consolidated"),
    )
    if settings.force_on_policy_ratio and gbs != rollout:
        raise ConfigError(
            f"'loss_fn.force_on_policy_ratio' needs policy.train_global_batch_size ({gbs}) equal to "
            f"num_prompts_per_step x num_generations_per_prompt ({rollout}): one update per rollout"
        )
    return settings


def _save_format(config: dict[str, Any]) -> str | None:
    """``checkpointing.model_save_format``: null, or (the v2 worker's Automodel) safetensors or torch_save."""
    value = _get(config, "checkpointing.model_save_format")
    if value not in (None, "safetensors", "torch_save"):
        raise ConfigError(f"'checkpointing.model_save_format' must be null, safetensors or torch_save, got {value!r}")
    return value


def _duration(config: dict[str, Any], key: str) -> int | None:
    """A "DD:HH:MM:SS" value in seconds (NeMo RL's convert_to_seconds), or None when the key is null."""
    value = _get(config, key)
    if value is None:
        return None
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"'{key}' must be null or 'DD:HH:MM:SS', got {value!r}")
    days, hours, minutes, seconds = map(int, parts)
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


class TimeoutChecker:
    """NeMo RL's TimeoutChecker with ``fit_last_save_time=True``: save once elapsed + mean step time >= the limit."""

    def __init__(self, limit_s: int | None) -> None:
        self.limit_s = math.inf if limit_s is None else float(limit_s)
        self.start = time.time()
        self.previous = self.start
        self.iteration_times: list[float] = []
        self.saved = False

    def mark_iteration(self) -> None:
        now = time.time()
        self.iteration_times.append(now - self.previous)
        self.previous = now

    def check_save(self) -> bool:
        if self.saved:
            return False
        elapsed = time.time() - self.start
        mean = sum(self.iteration_times) / len(self.iteration_times) if self.iteration_times else 0.0
        if elapsed + mean >= self.limit_s:
            self.saved = True
        return self.saved


def resolve_data_path(path: str) -> Path:
    """Where ``path`` lives on this machine.

    ``/data`` is the Lustre PVC mounted on every Ray pod. The local sandbox has no such mount: it sets
    ``SANDBOX_DATA_DIR`` to the directory standing for ``/data``, so the same override works in both places.
    """
    sandbox = os.environ.get("SANDBOX_DATA_DIR")
    if sandbox and (path == "/data" or path.startswith("/data/")):
        return Path(sandbox, path[len("/data") :].lstrip("/"))
    return Path(path)


# ==============================================================================================================
# Data: GSM8K-format word problems, a word-level tokenizer, and a stateful loader
# ==============================================================================================================

NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Tina", "Mark", "Ken", "Alexis")
ITEMS = ("apples", "clips", "books", "marbles", "stickers", "cookies", "pencils", "shells")
# (operation, question, worked solution): GSM8K's format, with its <<a+b=c>> calculator annotation and "#### N" line.
TEMPLATES = (
    (
        "+",
        "{n} has {a} {i}. {n} buys {b} more {i}. How many {i} does {n} have now?",
        "{n} starts with {a} {i} and buys {b} more.\n{n} has {a} + {b} = <<{a}+{b}={c}>>{c} {i} now.\n#### {c}",
    ),
    (
        "+",
        "{n} picked {a} {i} in the morning and {b} {i} in the afternoon. How many {i} did {n} pick in total?",
        "In the morning {n} picked {a} {i} and later {b} more.\n"
        "In total {n} picked {a} + {b} = <<{a}+{b}={c}>>{c} {i}.\n#### {c}",
    ),
    (
        "-",
        "{n} had {a} {i} and gave {b} of them to a friend. How many {i} does {n} have left?",
        "{n} gave away {b} of the {a} {i}.\n{n} has {a} - {b} = <<{a}-{b}={c}>>{c} {i} left.\n#### {c}",
    ),
    (
        "-",
        "{n} baked {a} {i} and the family ate {b} of them. How many {i} are left?",
        "The family ate {b} of the {a} {i}.\nThere are {a} - {b} = <<{a}-{b}={c}>>{c} {i} left.\n#### {c}",
    ),
)
# Irrelevant facts, as GSM8K problems have: the policy has to learn which numbers the question is about.
DISTRACTORS = ("{n} is {d} years old.", "The shop is {d} miles away.", "{n} has {d} friends.")
OPERATORS = ("+", "-")
_WORD = re.compile(r"\d+|[A-Za-z]+|[^\sA-Za-z\d]")
_FINAL_ANSWER = re.compile(r"=\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class Problem:
    """One GSM8K-format problem: the question, and the worked answer text ending in ``#### N``."""

    question: str
    answer: str


def make_problem(rng: random.Random, max_number: int, distractor_prob: float) -> Problem:
    """Draw one word problem whose numbers and answer lie in ``0..max_number`` (distractor numbers too)."""
    op, question, solution = rng.choice(TEMPLATES)
    if op == "+":
        a = rng.randint(0, max_number)
        b = rng.randint(0, max_number - a)
        c = a + b
    else:
        a = rng.randint(0, max_number)
        b = rng.randint(0, a)
        c = a - b
    fields = {"n": rng.choice(NAMES), "i": rng.choice(ITEMS), "a": a, "b": b, "c": c, "d": rng.randint(0, max_number)}
    if rng.random() < distractor_prob:
        question = f"{rng.choice(DISTRACTORS)} {question}"
    return Problem(question.format(**fields), solution.format(**fields))


def make_dataset(seed: int, size: int, max_number: int, distractor_prob: float) -> list[Problem]:
    """``size`` problems drawn from ``seed``; the same arguments always give the same list."""
    rng = random.Random(seed)
    return [make_problem(rng, max_number, distractor_prob) for _ in range(size)]


def calculate(expression: str) -> str:
    """Complete a written calculation the way GSM8K's calculator annotation does: ``3 + 4`` -> ``3 + 4 = 7``.

    The expression is evaluated left to right; anything that is not ``number (op number)+`` is returned unchanged,
    so it carries no final answer.
    """
    parts = expression.split()
    if len(parts) < 3 or len(parts) % 2 == 0:
        return expression
    try:
        value = int(parts[0])
        for op, number in zip(parts[1::2], parts[2::2], strict=True):
            if op not in OPERATORS:
                return expression
            value = value + int(number) if op == "+" else value - int(number)
    except ValueError:
        return expression
    return f"{expression} = {value}"


def final_answer(text: str) -> str | None:
    """The number after the response's final ``=`` (the calculator's result), or None when it computed nothing."""
    match = _FINAL_ANSWER.search(text)
    return match[1] if match else None


def ground_truth(problem: Problem, mode: str) -> str:
    """What the grader compares against: the ``#### N`` number, or (the tutorial's bug) the whole solution."""
    if mode == "full_solution":
        return problem.answer
    return problem.answer.rsplit("####", 1)[1].strip()


def reward(response: str, truth: str) -> float:
    """1.0 when the response's final answer equals the ground truth string, else 0.0."""
    answer = final_answer(response)
    return 1.0 if answer is not None and answer == truth.strip() else 0.0


class WordTokenizer:
    """A word-level tokenizer over the problems' fixed vocabulary; every number 0..max_number is one token."""

    SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")

    def __init__(self, max_number: int) -> None:
        words: set[str] = set(NAMES) | set(ITEMS) | set(OPERATORS)
        for text in (*(question for _, question, _ in TEMPLATES), *DISTRACTORS):
            words.update(_WORD.findall(re.sub(r"\{\w\}", " ", text)))
        numbers = [str(n) for n in range(max_number + 1)]
        self.tokens = [*self.SPECIALS, *numbers, *sorted(words - set(numbers))]
        self.ids = {token: index for index, token in enumerate(self.tokens)}
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (self.ids[s] for s in self.SPECIALS)
        self.number_ids = [self.ids[n] for n in numbers]
        self.operator_ids = [self.ids[op] for op in OPERATORS]

    def __len__(self) -> int:
        """The vocabulary size."""
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [self.ids.get(word, self.unk_id) for word in _WORD.findall(text)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, stopping at ``<eos>`` and leaving out padding."""
        words = []
        for index in ids:
            if index == self.eos_id:
                break
            if index != self.pad_id:
                words.append(self.tokens[index])
        return " ".join(words)

    def save_pretrained(self, path: Path, name: str) -> None:
        """Write a Hugging Face fast tokenizer that encodes as :meth:`encode` does and appends ``<bos>`` (where the
        policy's answer starts): ``tokenizer.json`` (the ``tokenizers`` library's), ``tokenizer_config.json`` and
        ``special_tokens_map.json``; ``AutoTokenizer.from_pretrained`` loads it."""
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

        path.mkdir(parents=True, exist_ok=True)
        fast = Tokenizer(models.WordLevel(vocab=self.ids, unk_token="<unk>"))
        split = pre_tokenizers.Split(Regex(_WORD.pattern), behavior="isolated")
        fast.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), split])
        fast.post_processor = processors.TemplateProcessing(single="$A <bos>", special_tokens=[("<bos>", self.bos_id)])
        fast.add_special_tokens(list(self.SPECIALS))
        fast.save(str(path / "tokenizer.json"))
        specials = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>"}
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "name_or_path": name,
            "model_max_length": 128,
            "padding_side": "left",
            **specials,
        }
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


class PromptLoader:
    """Batches of problems, reshuffled each epoch from the seed, with a state dict to resume mid-epoch."""

    def __init__(self, problems: list[Problem], batch_size: int, seed: int) -> None:
        self.problems = problems
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.batches_yielded = 0

    def __len__(self) -> int:
        """Batches per epoch (the last partial batch is dropped, as NeMo RL does)."""
        return len(self.problems) // self.batch_size

    def next_batch(self) -> list[Problem]:
        """The next batch of the current epoch."""
        order = torch.randperm(len(self.problems), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        start = self.batches_yielded * self.batch_size
        self.batches_yielded += 1
        return [self.problems[i] for i in order[start : start + self.batch_size].tolist()]

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch`` from its first batch."""
        self.epoch, self.batches_yielded = epoch, 0

    def state_dict(self) -> dict[str, int]:
        """Where the loader is: epoch and batches already yielded in it."""
        return {"epoch": self.epoch, "batches_yielded": self.batches_yielded, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict`."""
        self.epoch, self.batches_yielded, self.seed = state["epoch"], state["batches_yielded"], state["seed"]


# ==============================================================================================================
# Policy
# ==============================================================================================================


@dataclass
class Prompts:
    """A batch of tokenized questions: right-padded ids, lengths, and where the number tokens are."""

    ids: torch.Tensor
    lengths: torch.Tensor
    numbers: torch.Tensor


def encode_prompts(tokenizer: WordTokenizer, problems: list[Problem]) -> Prompts:
    """Tokenize and right-pad the questions."""
    ids = [tokenizer.encode(p.question) for p in problems]
    lengths = torch.tensor([len(x) for x in ids])
    padded = torch.full((len(ids), int(lengths.max())), tokenizer.pad_id)
    for row, x in enumerate(ids):
        padded[row, : len(x)] = torch.tensor(x)
    return Prompts(padded, lengths, torch.isin(padded, torch.tensor(tokenizer.number_ids)))


def build_policy(tokenizer: WordTokenizer, hidden_size: int) -> TinyPolicyForCausalLM:
    """A freshly initialised policy (seeded by the caller) over the tokenizer's vocabulary."""
    config = TinyPolicyConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        number_token_ids=tokenizer.number_ids,
        operator_token_ids=tokenizer.operator_ids,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
    )
    return TinyPolicyForCausalLM(config)


@dataclass
class Rollout:
    """Sampled responses (one row per generation) with their mask and generation log-probs."""

    responses: torch.Tensor
    mask: torch.Tensor
    logprobs: torch.Tensor


@torch.no_grad()
def generate(
    policy: TinyPolicyForCausalLM,
    tokenizer: WordTokenizer,
    prompts: Prompts,
    rows: torch.Tensor,
    *,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> Rollout:
    """Sample a response per row (greedy when ``generator`` is None) until ``<eos>`` or the token limit."""
    state, memory = policy.encode(prompts.ids, prompts.lengths, prompts.numbers, rows)
    tokens = torch.full((len(rows),), tokenizer.bos_id)
    done = torch.zeros(len(rows), dtype=torch.bool)
    out, masks, logps = [], [], []
    for position in range(max_new_tokens):
        logprobs, state = policy.step(tokens, state, memory, position)
        if generator is None:
            tokens = logprobs.argmax(dim=-1)
        else:
            tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)
        masks.append(~done)
        logps.append(logprobs.gather(1, tokens[:, None]).squeeze(1).masked_fill(done, 0.0))
        out.append(tokens.masked_fill(done, tokenizer.pad_id))
        done = done | (tokens == tokenizer.eos_id)
        if bool(done.all()):
            break
    return Rollout(torch.stack(out, 1), torch.stack(masks, 1), torch.stack(logps, 1))


def sequence_logprobs(
    policy: TinyPolicyForCausalLM, tokenizer: WordTokenizer, prompts: Prompts, rows: torch.Tensor, rollout: Rollout
) -> torch.Tensor:
    """Per-token log-probabilities of the rollout's responses under ``policy`` (0 where masked), with autograd."""
    state, memory = policy.encode(prompts.ids, prompts.lengths, prompts.numbers, rows)
    targets = rollout.responses
    inputs = torch.cat([torch.full((len(targets), 1), tokenizer.bos_id), targets[:, :-1]], dim=1)
    columns = []
    for position in range(targets.shape[1]):
        logprobs, state = policy.step(inputs[:, position], state, memory, position)
        # Padding after <eos> has no probability; read any finite entry there, the mask drops it.
        picked = logprobs.gather(1, targets[:, position : position + 1]).squeeze(1)
        columns.append(torch.where(rollout.mask[:, position], picked, 0.0))
    return torch.stack(columns, 1)


def responses_text(tokenizer: WordTokenizer, rollout: Rollout) -> list[str]:
    """Each response as text, completed by the calculator annotation."""
    return [calculate(tokenizer.decode(row)) for row in rollout.responses.tolist()]


def k3_kl(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """NeMo RL's per-token k3 KL estimate of KL(policy || reference), with its input and output clamps."""
    log_ratio = (reference - logprobs).clamp(-20.0, 20.0)
    return (log_ratio.exp() - 1 - log_ratio).clamp(-10.0, 10.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set (0 when none is)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class TrainData:
    """What the loss needs besides the current log-probs, one row per response (NeMo RL's ``train_data``)."""

    rows: torch.Tensor
    rollout: Rollout
    prev_logprobs: torch.Tensor
    reference_logprobs: torch.Tensor
    advantages: torch.Tensor

    def __getitem__(self, index: slice) -> TrainData:
        """The rows of one global batch."""
        rollout = Rollout(self.rollout.responses[index], self.rollout.mask[index], self.rollout.logprobs[index])
        return TrainData(
            self.rows[index], rollout, self.prev_logprobs[index], self.reference_logprobs[index], self.advantages[index]
        )


def grpo_loss(logprobs: torch.Tensor, data: TrainData, settings: Settings) -> torch.Tensor:
    """NeMo RL's token-level ClippedPGLoss: -min(r A, clip(r) A) + beta KL(policy || reference)."""
    if settings.force_on_policy_ratio:
        ratios = (logprobs - logprobs.detach()).exp()
        clamped = ratios
    else:
        ratios = (logprobs - data.prev_logprobs).exp()
        clamped = ratios.clamp(1.0 - settings.ratio_clip_min, 1.0 + settings.ratio_clip_max)
    advantages = data.advantages[:, None]
    policy_loss = torch.max(-advantages * ratios, -advantages * clamped)
    kl = settings.kl_penalty * k3_kl(logprobs, data.reference_logprobs)
    mask = data.rollout.mask.float()
    return masked_mean(policy_loss, mask) + masked_mean(kl, mask)


def group_advantages(rewards: torch.Tensor, group_size: int, normalize: bool) -> torch.Tensor:
    """Reward minus its group's mean, divided by the group's std (+1e-6) where that std is not zero."""
    groups = rewards.view(-1, group_size)
    advantages = groups - groups.mean(dim=1, keepdim=True)
    if normalize:
        std = groups.std(dim=1, keepdim=True)
        advantages = torch.where(std > 0, advantages / (std + 1e-6), advantages)
    return advantages.reshape(-1)


# ==============================================================================================================
# Checkpoints: NeMo RL's layout, one torch.distributed.checkpoint shard per training rank
# ==============================================================================================================


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _shard(tree: Any, mesh: Any, world_size: int) -> Any:
    """Each tensor as a DTensor sharded on its first dim that gives every rank a non-empty slice, else replicated.

    A replicated tensor is written once (DCP de-duplicates it onto one rank). 0-d tensors (Adam's step) and plain
    values stay as they are: DCP writes those from the coordinator rank.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if isinstance(tree, dict):
        return {key: _shard(value, mesh, world_size) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_shard(value, mesh, world_size) for value in tree]
    if not isinstance(tree, torch.Tensor) or tree.dim() == 0:
        return tree
    # Shard(d) splits like torch.chunk: the last rank gets a slice only if the others leave it one.
    dims = [d for d, size in enumerate(tree.shape) if math.ceil(size / world_size) * (world_size - 1) < size]
    placement = Shard(dims[0]) if dims else Replicate()
    # src_data_rank=None: every rank already holds the whole tensor (forked), so each keeps its own slice.
    return distribute_tensor(tree, mesh, [placement], src_data_rank=None)


def _save_rank(rank: int, world_size: int, port: int, states: dict[str, dict[str, Any]], hf_paths: set[str]) -> None:
    """One training rank: join the gloo group and write its shard of every state with ``dcp.save`` (through torch's
    Hugging Face writer, one sharded safetensors file per rank, for the paths in ``hf_paths``)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    warnings.filterwarnings("ignore")
    # Every rank is on this machine: talk over loopback, whatever interface the pod's GLOO_SOCKET_IFNAME names.
    loopback = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]
    else:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
    # A rank that dies must not leave the others waiting on a collective for gloo's default 30 minutes.
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        for path, state in states.items():
            if path in hf_paths:
                writer = dcp.HuggingFaceStorageWriter(path=path, save_distributed=True)
                dcp.save(_shard(state, mesh, world_size), storage_writer=writer)
            else:
                dcp.save(_shard(state, mesh, world_size), checkpoint_id=path)
    finally:
        dist.destroy_process_group()


def save_sharded(states: dict[Path, dict[str, Any]], world_size: int, hf_paths: tuple[Path, ...] = ()) -> None:
    """Write each state dict to its directory as ``world_size`` ranks would: ``.metadata`` + ``__{rank}_0.distcp``,
    or for the paths in ``hf_paths`` one ``shard-{rank+1}-model-00001-of-00001.safetensors`` per rank."""
    # DTensor's first use imports torch._dynamo; importing it once before forking spares every rank that cost.
    importlib.import_module("torch._dynamo")
    torch.multiprocessing.start_processes(
        _save_rank,
        args=(
            world_size,
            _free_port(),
            {str(path): state for path, state in states.items()},
            {str(p) for p in hf_paths},
        ),
        nprocs=world_size,
        start_method="fork",
    )


def load_weights(policy: TinyPolicyForCausalLM, weights: Path) -> None:
    """Load the policy's weights from ``step_N/policy/weights`` (any number of ranks, either worker's layout: v1's
    DCP there, or v2's ``model/`` of sharded safetensors or DCP) into this single process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    with warnings.catch_warnings():
        # DCP warns that no process group exists: reading every rank's shard into one process is the intent here.
        warnings.simplefilter("ignore")
        model_dir = weights / "model"
        if not model_dir.is_dir():
            model_state = {"model": get_model_state_dict(policy)}
            dcp.load(model_state, checkpoint_id=weights)
            set_model_state_dict(policy, model_state["model"])
            return
        flat = get_model_state_dict(policy)
        hf = any(p.suffix == ".safetensors" for p in model_dir.iterdir())
        reader = dcp.HuggingFaceStorageReader(str(model_dir)) if hf else None
        dcp.load(flat, checkpoint_id=model_dir, storage_reader=reader)
        set_model_state_dict(policy, flat)


def load_sharded(policy: TinyPolicyForCausalLM, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """Load weights and optimizer state of ``checkpoint`` (step_N) into this single process: the optimizer from v1's
    ``policy/optimizer`` or v2's ``policy/optimizer/optim``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    load_weights(policy, checkpoint / WEIGHTS)
    optim = checkpoint / OPTIMIZER / ("optim" if (checkpoint / WEIGHTS / "model").is_dir() else "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optim_state = {"optim": {"optim": get_optimizer_state_dict(policy, optimizer)}}
        dcp.load(optim_state, checkpoint_id=optim)
        set_optimizer_state_dict(policy, optimizer, optim_state["optim"]["optim"])


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The ``step_N`` directory with the highest N (``tmp_step_*`` and others are ignored)."""
    if not checkpoint_dir.is_dir():
        return None
    steps = [(int(m[1]), p) for p in checkpoint_dir.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return max(steps)[1] if steps else None


def remove_old_checkpoints(checkpoint_dir: Path, settings: Settings) -> None:
    """Keep the ``keep_top_k`` best ``step_N`` by the metric (or the newest without one), and always the latest."""
    if settings.keep_top_k is None:
        return
    history = []
    for path in checkpoint_dir.iterdir():
        match = _STEP_DIR.fullmatch(path.name)
        if match and (path / "training_info.json").is_file():
            history.append((int(match[1]), path, json.loads((path / "training_info.json").read_text())))
    if not history:
        return
    latest = max(step for step, _, _ in history)
    if settings.metric_name is None:
        history.sort(key=lambda h: h[0], reverse=True)
    else:
        worst = -math.inf if settings.higher_is_better else math.inf
        sign = 1 if settings.higher_is_better else -1
        history.sort(key=lambda h: (sign * h[2].get(settings.metric_name, worst), h[0]), reverse=True)
    for step, path, _ in history[settings.keep_top_k :]:
        if step != latest:
            print(f"Removing checkpoint {path} due to being outside top-{settings.keep_top_k}", flush=True)
            shutil.rmtree(path)


# ==============================================================================================================
# Training loop and NeMo RL's stdout markers
# ==============================================================================================================


class ResourceInsufficientError(RuntimeError):
    """The cluster has not the GPUs the job asks for (NeMo RL's RayVirtualCluster raises one by this name)."""


class NodeWorkers:
    """One Ray actor per GPU node, each holding that node's GPUs, that grades responses (the job's work on the
    workers). Outside a Ray job there are none and grading runs in process."""

    def __init__(self, num_nodes: int, gpus_per_node: int) -> None:
        self.actors: list[Any] = []
        if not os.environ.get("RAY_ADDRESS") or num_nodes < 1 or gpus_per_node < 1:
            return
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, configure_logging=False)
        grader = ray.remote(num_cpus=0)(_Grader)
        self.actors = [grader.options(num_gpus=gpus_per_node).remote() for _ in range(num_nodes)]
        # NeMo RL retries its placement group NRL_VIRTUAL_CLUSTER_MAX_RETRIES times (about 63 s in all, FACTS §18).
        attempts = int(os.environ.get("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "6"))
        for attempt in range(1, attempts + 1):
            _, waiting = ray.wait(
                [a.ready.remote() for a in self.actors], num_returns=len(self.actors), timeout=2**attempt
            )
            if not waiting:
                say(f"  ✓ {num_nodes} worker node(s) with {gpus_per_node} GPUs each")
                return
            say(
                f"Waiting for {len(waiting)} of {num_nodes} worker node(s) with {gpus_per_node} GPUs "
                f"(try {attempt}/{attempts})"
            )
        raise ResourceInsufficientError(
            f"{num_nodes} node(s) x {gpus_per_node} GPUs requested, but the cluster has "
            f"{ray.available_resources().get('GPU', 0):.0f} GPUs available after {attempts} tries"
        )

    def grade(self, texts: list[str], truths: list[str]) -> list[float]:
        """The reward of each response, graded on the worker nodes (a lost node raises Ray's error)."""
        pairs = list(zip(texts, truths, strict=True))
        if not self.actors:
            return [reward(text, truth) for text, truth in pairs]
        import ray

        size = -(-len(pairs) // len(self.actors))
        chunks = [pairs[i : i + size] for i in range(0, len(pairs), size)]
        graded = ray.get([actor.grade.remote(chunk) for actor, chunk in zip(self.actors, chunks, strict=False)])
        return [value for chunk in graded for value in chunk]


class _Grader:
    """The actor on one worker node (pickled by value: it needs only the standard library)."""

    def ready(self) -> int:
        return os.getpid()

    def grade(self, pairs: list[tuple[str, str]]) -> list[float]:
        return [reward(text, truth) for text, truth in pairs]


@dataclass
class Run:
    """What a training run carries from step to step."""

    config: dict[str, Any]
    settings: Settings
    tokenizer: WordTokenizer
    val_set: list[Problem]
    policy: TinyPolicyForCausalLM
    reference: TinyPolicyForCausalLM
    optimizer: torch.optim.Optimizer
    loader: PromptLoader
    workers: NodeWorkers


def build_run(config: dict[str, Any], settings: Settings, checkpoint: Path | None) -> Run:
    """Data, tokenizer, policy, frozen reference and optimizer from the seed; weights and loader from ``checkpoint``."""
    # One thread: the model is tiny (more threads only add overhead on shared cores), and forking for saves stays safe.
    torch.set_num_threads(1)
    torch.manual_seed(settings.seed)
    tokenizer = WordTokenizer(settings.max_number)
    train_set = make_dataset(settings.seed, settings.num_train_samples, settings.max_number, settings.distractor_prob)
    val_set = make_dataset(settings.seed + 1, settings.num_val_samples, settings.max_number, settings.distractor_prob)
    policy = build_policy(tokenizer, settings.hidden_size)
    # The reference is the initial policy, rebuilt from the seed on resume just as NeMo RL reloads the base model.
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=settings.lr)
    loader = PromptLoader(train_set, settings.num_prompts, settings.seed)
    say(f"  ✓ Training dataloader loaded with {len(train_set)} samples")
    say(f"  ✓ Validation dataloader loaded with {len(val_set)} samples")
    say(
        f"  ✓ Policy {_get(config, 'policy.model_name')}: {sum(p.numel() for p in policy.parameters())} parameters, "
        f"{settings.training_ranks} training ranks, {settings.generation_gpus} generation GPUs"
    )
    if checkpoint is not None:
        say(f"Loading weights from {checkpoint / 'policy' / 'weights'}")
        load_sharded(policy, optimizer, checkpoint)
        loader.load_state_dict(torch.load(checkpoint / "train_dataloader.pt", weights_only=True))
    workers = NodeWorkers(_int(config, "cluster.num_nodes", 1), _int(config, "cluster.gpus_per_node", 1))
    return Run(config, settings, tokenizer, val_set, policy, reference, optimizer, loader, workers)


def save_v2(run: Run, tmp: Path, optimizer: dict[str, Any]) -> None:
    """The v2 worker's Automodel save: the model's flat Hugging Face state dict in ``policy/weights/model`` (one
    sharded safetensors file per rank through torch's Hugging Face writer, or DCP with torch_save), the Hugging Face
    metadata beside it (``.hf_metadata``, rank 0's), the optimizer as DCP in ``policy/optimizer/optim``; with
    save_consolidated, the whole model as Hugging Face safetensors in ``model/consolidated`` instead of the
    metadata (Automodel's ConsolidatedHFAddon)."""
    from safetensors.torch import save_file

    model_dir = tmp / WEIGHTS / "model"
    flat = {key: value.detach().clone() for key, value in run.policy.state_dict().items()}
    safetensors = run.settings.model_save_format != "torch_save"
    save_sharded(
        {model_dir: flat, tmp / OPTIMIZER / "optim": optimizer},
        run.settings.training_ranks,
        hf_paths=(model_dir,) if safetensors else (),
    )
    if not safetensors:
        return
    config = run.policy.config
    metadata = model_dir / ".hf_metadata"
    metadata.mkdir()
    (metadata / "config.json").write_text(config.to_json_string(use_diff=False))
    (metadata / "generation_config.json").write_text(run.policy.generation_config.to_json_string())
    (metadata / "fqn_to_file_index_mapping.json").write_text(json.dumps(dict.fromkeys(flat, 1)))
    if run.settings.save_consolidated:
        consolidated = model_dir / "consolidated"
        consolidated.mkdir()
        name = "model-00001-of-00001.safetensors"
        save_file({k: v.contiguous() for k, v in flat.items()}, str(consolidated / name), metadata={"format": "pt"})
        size = sum(v.numel() * v.element_size() for v in flat.values())
        index = {"metadata": {"total_size": size}, "weight_map": dict.fromkeys(flat, name)}
        (consolidated / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        for item in ("config.json", "generation_config.json"):
            (metadata / item).rename(consolidated / item)
        shutil.rmtree(metadata)


def save_checkpoint(run: Run, step: int, training_info: dict[str, Any]) -> Path:
    """Write ``tmp_step_N`` in NeMo RL's layout, then rename it to ``step_N`` so a reader never sees half of one."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    root = run.settings.checkpoint_dir
    tmp = root / f"tmp_step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "training_info.json").write_text(json.dumps(training_info))
    (tmp / "config.yaml").write_text(yaml.safe_dump(run.config, sort_keys=False))
    settings = run.settings
    optimizer = {"optim": {"optim": get_optimizer_state_dict(run.policy, run.optimizer)}}
    if not settings.v2:
        if settings.model_save_format is not None:
            # NeMo RL's lm_policy.py refuses it at this point, after the steps before it trained.
            raise ValueError("model_save_format must be None or omitted if using DTensorPolicyWorker (_v2=False).")
        # NeMo RL's keys: dcp.save({"model": ModelState}) and dcp.save({"optim": OptimizerState}), state {"optim"}.
        weights = {"model": get_model_state_dict(run.policy)}
        save_sharded({tmp / WEIGHTS: weights, tmp / OPTIMIZER: optimizer}, settings.training_ranks)
    else:
        save_v2(run, tmp, optimizer)
    run.tokenizer.save_pretrained(tmp / "policy" / "tokenizer", str(_get(run.config, "policy.model_name")))
    torch.save(run.loader.state_dict(), tmp / "train_dataloader.pt")
    final = root / f"step_{step}"
    if final.exists():
        old = root / f"old_step_{step}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    remove_old_checkpoints(root, run.settings)
    return final


class Timer:
    """Summed wall time per named phase, like NeMo RL's Timer with ``reduction_op="sum"``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` body to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start


def say(text: str = "") -> None:
    """Print one line and flush it: the logs are tailed live."""
    print(text, flush=True)


def print_training_results(metrics: dict[str, float], timings: dict[str, float]) -> None:
    """NeMo RL v0.5.0's per-step "Training Results" and "Timing" blocks."""
    say("\n📊 Training Results:")
    say(f"  • Loss: {metrics['loss']:.4f}")
    say(f"  • Generation KL Error: {metrics['gen_kl_error']:.4f}")
    say(f"  • Avg Reward: {metrics['reward']:.4f}")
    say(f"  • Mean Generation Length: {metrics['mean_gen_tokens_per_sample']:.4f}")
    say("\n⏱️  Timing:")
    total = timings["total_step_time"]
    say(f"  • Total step time: {total:.2f}s")
    for name, seconds in sorted(timings.items(), key=lambda item: item[1], reverse=True):
        if name != "total_step_time":
            say(f"  • {name}: {seconds:.2f}s ({(seconds / total * 100) if total > 0 else 0:.1f}%)")


def print_performance_metrics(metrics: dict[str, float], timings: dict[str, float], settings: Settings) -> None:
    """NeMo RL v0.5.0's ``print_performance_metrics`` throughput lines (synchronous GRPO)."""
    tokens = metrics["total_num_tokens"]
    samples = settings.num_prompts * settings.num_generations
    total, training = timings["total_step_time"], timings["policy_training"]
    logprobs = timings["policy_and_reference_logprobs"]
    e2e_samples = samples / total / settings.total_gpus
    e2e_tokens = tokens / total / settings.total_gpus
    train_group = tokens / (training + logprobs) / settings.training_ranks
    generation = tokens / timings["generation"] / settings.generation_gpus
    say("\n🔍 Performance Metrics:")
    say(f"  • Mean Total Tokens per Sample: {metrics['mean_total_tokens_per_sample']:.2f}")
    say("  • Throughputs (per GPU):")
    say(f"    - E2E (Samples/sec/gpu): {e2e_samples:.2f}")
    say(f"    - E2E (Tokens/sec/gpu): {e2e_tokens:.2f}")
    say(f"    - Policy Training (Tokens/sec/gpu): {tokens / training / settings.training_ranks:.2f}")
    say(f"    - Policy and Reference Logprobs (Tokens/sec/gpu): {tokens / logprobs / settings.training_ranks:.2f}")
    say(f"    - Training Worker Group (Tokens/sec/gpu): {train_group:.2f}")
    say(f"    - Generation Worker Group (Tokens/sec/gpu): {generation:.2f}")
    say("  • Throughputs (per Group):")
    say(f"    - E2E (Samples/sec): {e2e_samples * settings.total_gpus:.2f}")
    say(f"    - E2E (Tokens/sec): {e2e_tokens * settings.total_gpus:.2f}")
    say(f"    - Training Worker Group (Tokens/sec): {train_group * settings.training_ranks:.2f}")
    say(f"    - Generation Worker Group (Tokens/sec): {generation * settings.generation_gpus:.2f}")


def validate(run: Run, step: int) -> dict[str, float]:
    """Greedy answers on the validation set, graded like training; prints NeMo RL's "Validation Results"."""
    start = time.perf_counter()
    say(f"▶ Starting validation at step {step}...")
    run.policy.eval()
    prompts = encode_prompts(run.tokenizer, run.val_set)
    rows = torch.arange(len(run.val_set))
    # Greedy rather than sampled: a small validation set then gives a stable accuracy.
    rollout = generate(
        run.policy, run.tokenizer, prompts, rows, max_new_tokens=run.settings.max_new_tokens, generator=None
    )
    rewards = [
        reward(text, ground_truth(p, run.settings.ground_truth))
        for text, p in zip(responses_text(run.tokenizer, rollout), run.val_set, strict=True)
    ]
    accuracy = sum(rewards) / len(rewards)
    avg_length = float(rollout.mask.sum(dim=1).float().mean())
    say("\n📊 Validation Results:")
    say(f"    • Accuracy: {accuracy:.4f}")
    say(f"    • Average response length: {avg_length:.1f} tokens")
    say(f"    • Samples processed: {len(rewards)}")
    say("\n  ⏱️  Validation Timing:")
    say(f"    • Total validation time: {time.perf_counter() - start:.2f}s")
    return {"accuracy": accuracy, "avg_length": avg_length}


def train_step(run: Run, batch: list[Problem], step: int, timer: Timer) -> dict[str, float]:
    """One GRPO step: sample a group per prompt, grade, compute advantages, then update on the clipped loss."""
    settings, tokenizer, policy = run.settings, run.tokenizer, run.policy
    n = settings.num_generations
    say("▶ Preparing batch...")
    with timer.time("data_processing"):
        prompts = encode_prompts(tokenizer, batch)
        rows = torch.arange(len(batch)).repeat_interleave(n)
        truths = [ground_truth(batch[row], settings.ground_truth) for row in rows.tolist()]
    say(f"▶ Generating responses for batch of size {len(rows)}...")
    with timer.time("prepare_for_generation/total"):
        # Generation is colocated and shares the policy's weights: the "refit" is switching to inference mode.
        policy.eval()
    with timer.time("generation"):
        # Seeded by step, so a resumed run samples what an uninterrupted one would have.
        generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
        rollout = generate(
            policy, tokenizer, prompts, rows, max_new_tokens=settings.max_new_tokens, generator=generator
        )
    say("▶ Processing rewards...,")
    with timer.time("reward_calculation"):
        texts = responses_text(tokenizer, rollout)
        rewards = torch.tensor(run.workers.grade(texts, truths))
        say("▶ Computing advantages...")
        advantages = group_advantages(rewards, n, settings.normalize_rewards)
    say("▶ Computing logprobs...")
    with timer.time("policy_and_reference_logprobs"), torch.no_grad():
        data = TrainData(
            rows,
            rollout,
            sequence_logprobs(policy, tokenizer, prompts, rows, rollout),
            sequence_logprobs(run.reference, tokenizer, prompts, rows, rollout),
            advantages,
        )
    say("▶ Preparing for training...")
    with timer.time("training_prep"):
        policy.train()
    say("▶ Training policy...")
    losses, grad_norms = [], []
    with timer.time("policy_training"):
        for start in range(0, len(rows), settings.global_batch_size):
            part = data[start : start + settings.global_batch_size]
            loss = grpo_loss(sequence_logprobs(policy, tokenizer, prompts, part.rows, part.rollout), part, settings)
            run.optimizer.zero_grad()
            loss.backward()
            grad_norms.append(float(nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)))
            run.optimizer.step()
            losses.append(float(loss.detach()))
    mask = rollout.mask.float()
    response_tokens = mask.sum(dim=1)
    total_tokens = prompts.lengths[rows].float() + response_tokens
    return {
        # NeMo RL sums the loss over the step's global batches.
        "loss": sum(losses),
        "grad_norm": sum(grad_norms),
        # NeMo RL's gen_kl_error: k3 KL between the generation's and the training policy's log-probs.
        "gen_kl_error": float(masked_mean(k3_kl(rollout.logprobs, data.prev_logprobs), mask)),
        "reward": float(rewards.mean()),
        "mean_gen_tokens_per_sample": float(response_tokens.mean()),
        "mean_total_tokens_per_sample": float(total_tokens.mean()),
        "total_num_tokens": float(total_tokens.sum()),
        "global_valid_toks": float(response_tokens.sum()),
    }


def grpo_step(run: Run, save_state: dict[str, Any], timeout: TimeoutChecker) -> bool:
    """One step with NeMo RL's bookkeeping: header, training, validation, checkpoint, then the printed results.
    Returns whether ``checkpoint_must_save_by`` made it save (training then stops)."""
    settings = run.settings
    step = save_state["total_steps"] + 1
    batch = run.loader.next_batch()
    header_total = min(len(run.loader), settings.max_num_steps)
    say(f"\n{'=' * 25} Step {save_state['current_step'] + 1}/{header_total} {'=' * 25}")
    timer = Timer()
    with timer.time("total_step_time"):
        metrics = train_step(run, batch, step, timer)
        val_metrics = validate(run, step) if settings.val_period > 0 and step % settings.val_period == 0 else None
        is_last_step = step >= settings.max_num_steps or (
            save_state["current_epoch"] + 1 == settings.max_num_epochs
            and save_state["current_step"] + 1 == len(run.loader)
        )
        save_state["current_step"] += 1
        save_state["total_steps"] = step
        save_state["consumed_samples"] += settings.num_prompts
        save_state["total_valid_tokens"] += int(metrics["global_valid_toks"])
        timeout.mark_iteration()
        by_timeout = timeout.check_save()
        if settings.checkpointing and (is_last_step or step % settings.save_period == 0 or by_timeout):
            info = dict(save_state)
            if val_metrics is not None:
                info["val_reward"] = val_metrics["accuracy"]
            if settings.metric_name is not None:
                prefix, name = settings.metric_name.split(":", 1)
                source = metrics if prefix == "train" else val_metrics
                # Without a validation this step the checkpoint carries no metric, as in NeMo RL.
                if source is not None:
                    info[settings.metric_name] = source[name]
            with timer.time("checkpointing"):
                say(f"Saving checkpoint for step {step}...")
                save_checkpoint(run, step, info)
    print_training_results(metrics, timer.totals)
    print_performance_metrics(metrics, timer.totals, settings)
    if settings.hang_after_step is not None and step >= settings.hang_after_step:
        # Stuck as a job in an NCCL collective is: alive, silent, until it is stopped.
        while True:
            time.sleep(3600)
    time.sleep(settings.step_delay_s)
    return by_timeout


def print_setup_complete(seconds: float) -> None:
    """NeMo RL's end-of-setup block (``setup`` in ``nemo_rl/algorithms/grpo.py``, v0.5.0 and v0.7.0): the trigger
    reads it as the start of the deadline clock."""
    say("\n" + "=" * 60)
    say(" " * 18 + "SETUP COMPLETE")
    say(f"  Total setup time: {seconds:.1f}s")
    say("=" * 60 + "\n")


def train(config: dict[str, Any], settings: Settings, started: float | None = None) -> int:
    """Run (or resume) GRPO until ``grpo.max_num_steps``; returns the process exit status. ``started``: when the
    setup began (perf_counter; None: now)."""
    started = time.perf_counter() if started is None else started
    checkpoint = latest_checkpoint(settings.checkpoint_dir)
    save_state: dict[str, Any] = {
        "consumed_samples": 0,
        "current_step": 0,
        "current_epoch": 0,
        "total_steps": 0,
        "total_valid_tokens": 0,
    }
    if checkpoint is not None:
        info = json.loads((checkpoint / "training_info.json").read_text())
        save_state = {key: info[key] for key in save_state}
        if save_state["total_steps"] >= settings.max_num_steps:
            say(
                f"Checkpoint {checkpoint} is at step {save_state['total_steps']}, which already reaches "
                f"grpo.max_num_steps={settings.max_num_steps}: nothing to train. Raise grpo.max_num_steps to continue."
            )
            return 0
    run = build_run(config, settings, checkpoint)
    # A slow model load, when a test asks for one: before the block that ends the setup, as in NeMo RL.
    time.sleep(settings.setup_delay_s)
    print_setup_complete(time.perf_counter() - started)
    # As in NeMo RL, the deadline's clock starts with the training loop, after the model and data are set up.
    timeout = TimeoutChecker(settings.must_save_by_s)
    while save_state["current_epoch"] < settings.max_num_epochs and save_state["total_steps"] < settings.max_num_steps:
        say(f"\n{'=' * 25} Epoch {save_state['current_epoch'] + 1}/{settings.max_num_epochs} {'=' * 25}")
        if run.loader.epoch != save_state["current_epoch"]:
            run.loader.start_epoch(save_state["current_epoch"])
        while run.loader.batches_yielded < len(run.loader):
            if grpo_step(run, save_state, timeout):
                say("Timeout has been reached, stopping training early")
                return 0
            if save_state["total_steps"] >= settings.max_num_steps:
                say("Max number of steps has been reached, stopping training early")
                return 0
        save_state["current_epoch"] += 1
        save_state["current_step"] = 0
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``--config`` and the Hydra overrides, check them, and train; returns the exit status."""
    started = time.perf_counter()
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="base config (NeMo RL key layout)")
    args, overrides = parser.parse_known_args(argv)
    try:
        config = load_config(args.config, overrides)
        return train(config, read_settings(config), started)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
