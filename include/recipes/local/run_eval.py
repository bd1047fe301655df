"""The local evaluator: the sandbox's stand-in for NeMo RL's ``examples/run_eval.py``.

It loads the model named by ``generation.model_name`` with ``transformers`` (a Hugging Face export:
``AutoModelForCausalLM`` with the model's own code, ``AutoTokenizer``), or ``local/tiny-policy``, the untrained policy
the trainer starts from (the base model); answers held-out GSM8K-format problems the trainer never saw (drawn from
their own seed, less any problem of the training split) with ``generate``; grades them as the trainer does; and prints
the result block exactly as ``nemo_rl/evals/eval.py`` prints it (``_print_results``, v0.5.0 lines 500-505, v0.7.0
lines 537-542), its score NeMo RL's pass@k over ``eval.num_tests_per_prompt`` samples per problem. CPU only.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpo_cpu
import torch

BASE_MODEL = "local/tiny-policy"
BATCH = 64


def problems(data: dict[str, Any]) -> list[grpo_cpu.Problem]:
    """The held-out problems: drawn from ``data.seed``, without any question of the trainer's training split."""
    seen = {
        p.question
        for p in grpo_cpu.make_dataset(
            int(data["train_seed"]), int(data["num_train_samples"]), int(data["max_number"]),
            float(data["distractor_prob"]),
        )
    }  # fmt: skip
    drawn = grpo_cpu.make_dataset(
        int(data["seed"]), 8 * int(data["num_problems"]), int(data["max_number"]), float(data["distractor_prob"])
    )
    return [p for p in drawn if p.question not in seen][: int(data["num_problems"])]


def load(generation: dict[str, Any], max_number: int) -> tuple[Any, Any]:
    """The model and its tokenizer: a Hugging Face directory, or the trainer's initial policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = str(generation["model_name"])
    if name == BASE_MODEL:
        torch.manual_seed(int(generation["init_seed"]))
        words = grpo_cpu.WordTokenizer(max_number)
        model = grpo_cpu.build_policy(words, int(generation["hidden_size"]))
        # Written only to be loaded as a Hugging Face tokenizer, which keeps what it needs in memory: a temporary
        # directory (each evaluation used to leave one behind under $TMPDIR).
        with tempfile.TemporaryDirectory(prefix="base-tokenizer-") as path:
            words.save_pretrained(Path(path), BASE_MODEL)
            return model.eval(), AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=True)
    return model.eval(), AutoTokenizer.from_pretrained(name)


def pass_at_k(n: int, c: int, k: int) -> float:
    """NeMo RL's unbiased pass@k of one problem (eval.py eval_pass_k): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@torch.no_grad()
def score(
    model: Any, tokenizer: Any, batch: list[grpo_cpu.Problem], generation: dict[str, Any], tests: int
) -> list[int]:
    """How many of ``tests`` sampled answers to each problem are right."""
    inputs = tokenizer([p.question for p in batch], return_tensors="pt", padding=True)
    temperature = float(generation["temperature"])
    sample = temperature > 0
    options: dict[str, Any] = {"do_sample": sample, "max_new_tokens": 8, "num_return_sequences": tests}
    if sample:
        top_k = int(generation["top_k"])
        options.update(temperature=temperature, top_p=float(generation["top_p"]), top_k=top_k if top_k > 0 else None)
    out = model.generate(**inputs, **options)
    answers = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    right = [0] * len(batch)
    for index, text in enumerate(answers):
        problem = batch[index // tests]
        right[index // tests] += int(
            grpo_cpu.reward(grpo_cpu.calculate(text), grpo_cpu.ground_truth(problem, "final_answer"))
        )
    return right


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print NeMo RL's result block; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="eval.yaml", type=Path)
    args, overrides = parser.parse_known_args(argv)
    try:
        config = grpo_cpu.load_config(args.config, overrides)
    except grpo_cpu.ConfigError as exc:
        print(f"run_eval.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    evaluation, generation, data = config["eval"], config["generation"], config["data"]
    metric, k_value, tests = (
        str(evaluation["metric"]),
        int(evaluation["k_value"]),
        int(evaluation["num_tests_per_prompt"]),
    )
    # eval.py's own asserts (v0.5.0 lines 107-116).
    assert metric in ["pass@k", "cons@k"], f"Invalid metric: {metric}"
    if tests > 1:
        assert float(generation["temperature"]) > 0 and int(generation["top_k"]) != 1, "sampling needs temperature"
    assert k_value >= 1 and tests >= k_value
    torch.set_num_threads(1)
    torch.manual_seed(int(evaluation["seed"]))
    model, tokenizer = load(generation, int(data["max_number"]))
    held_out = problems(data)
    total = 0.0
    for start in range(0, len(held_out), BATCH):
        batch = held_out[start : start + BATCH]
        total += sum(pass_at_k(tests, c, k_value) for c in score(model, tokenizer, batch, generation, tests))
    dataset_size = len(held_out)
    # nemo_rl/evals/eval.py _print_results, verbatim in what it prints.
    dataset_name = os.path.basename(str(data["dataset_name"]))
    model_name = os.path.basename(str(generation["model_name"]))
    max_new_tokens = generation["vllm_cfg"]["max_model_len"]
    seed = evaluation["seed"]
    temperature = generation["temperature"]
    top_p = generation["top_p"]
    top_k = generation["top_k"]
    average_score = total / dataset_size
    num_tests_per_prompt = tests
    print("\n" + "=" * 60)
    print(f"{model_name=} {dataset_name=}")
    print(f"{max_new_tokens=} {temperature=} {top_p=} {top_k=} {seed=}\n")
    print(f"metric={metric[:-1]}{k_value} {num_tests_per_prompt=}\n")
    print(f"score={average_score:.4f} ({total}/{dataset_size})")
    print("=" * 60 + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
