"""NeMo RL's evaluation result block, read from a job log as each pinned release prints it.

The blocks are built by executing each release's own print statements (``nemo_rl/evals/eval.py`` ``_print_results``,
quoted verbatim below) and embedded in a Ray job log with ``(pid=...)`` prefixes and repeat markers around them.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from nemo_rl_gke.observe.eval_result import parse_eval_result

# The print statements of _print_results, verbatim: v0.5.0 nemo_rl/evals/eval.py:500-505 and v0.7.0 :537-542 are
# the same six lines (read at both tags; docs/model-out.md).
PRINTS = """print("\\n" + "=" * 60)
print(f"{model_name=} {dataset_name=}")
print(f"{max_new_tokens=} {temperature=} {top_p=} {top_k=} {seed=}\\n")
print(f"metric={metric[:-1]}{k_value} {num_tests_per_prompt=}\\n")
print(f"score={average_score:.4f} ({score}/{dataset_size})")
print("=" * 60 + "\\n")"""


def _block(tag: str, **values: object) -> str:
    """What the release ``tag`` prints for these values (both tags print the same statements)."""
    assert tag in ("v0.5.0", "v0.7.0")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(PRINTS, {}, dict(values))  # the release's own print statements, nothing else
    return out.getvalue()


@pytest.mark.parametrize("tag", ["v0.5.0", "v0.7.0"])
def test_the_result_block_is_read_as_each_release_prints_it_inside_a_real_job_log(tag: str) -> None:
    block = _block(
        tag,
        model_name="hf",
        dataset_name="gsm8k_test.jsonl",
        max_new_tokens=2048,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        seed=42,
        metric="pass@k",
        k_value=1,
        num_tests_per_prompt=16,
        average_score=447.43750113248825 / 500,
        score=447.43750113248825,
        dataset_size=500,
    )
    assert "score=0.8949 (447.43750113248825/500)" in block and "model_name='hf'" in block
    log = (
        "(VllmGenerationWorker pid=4242, ip=10.0.0.5) INFO 12-05 vLLM is ready\n"
        "(pid=4243) Processed prompts: 100%|##########| 500/500 [00:31<00:00, 16.01it/s]\n"
        "(VllmGenerationWorker pid=4242, ip=10.0.0.5) shutting down [repeated 7x across cluster] (Ray deduplicates "
        "logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication)\n"
        f"{block}"
        "(raylet) [2026-12-05 06:00:00,000 I 1 1] worker exited\n"
    )
    result = parse_eval_result(log)
    assert result is not None
    assert (result.model, result.dataset, result.metric, result.k) == ("hf", "gsm8k_test.jsonl", "pass", 1)
    assert (result.max_new_tokens, result.temperature, result.top_p, result.top_k, result.seed) == (
        2048,
        0.0,
        1.0,
        -1,
        42,
    )
    assert (result.num_tests_per_prompt, result.problems) == (16, 500)
    assert result.score == pytest.approx(0.8949) and result.total == pytest.approx(447.43750113248825)
    assert result.text() == "score 0.8949 (447.438/500) on gsm8k_test.jsonl, pass@1 over 16 sample(s)"


def test_the_last_complete_block_wins_and_a_broken_or_absent_one_is_none() -> None:
    first = _block("v0.7.0", model_name="base", dataset_name="math500", max_new_tokens=2048, temperature=0.6,
                   top_p=0.95, top_k=-1, seed=1, metric="cons@k", k_value=4, num_tests_per_prompt=8,
                   average_score=0.5, score=250.0, dataset_size=500)  # fmt: skip
    second = first.replace("model_name='base'", "model_name='hf'").replace("score=0.5000 (250.0", "score=0.6000 (300.0")
    result = parse_eval_result(first + second)
    assert result is not None and (result.model, result.score, result.metric, result.k) == ("hf", 0.6, "cons", 4)
    # A block cut before its score, a score with no block, and garbage: nothing.
    assert parse_eval_result(first.split("score=")[0]) is None
    assert parse_eval_result("score=0.9000 (9.0/10)\n") is None
    assert parse_eval_result("model_name=''' dataset_name='x'\n" + "=" * 10_000 + "\n") is None
    assert parse_eval_result(re.sub(r"score=\S+", "score=nan", first)) is None
