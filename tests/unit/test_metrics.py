"""Driver-log following: display lines, NeMo RL step metrics, the run summary and the zero-learning guard.

The fixture is a NeMo RL v0.5.0-style GRPO driver log as the Ray Jobs API returns it: raw ``\\r`` progress-bar
redraws, ANSI-coloured Ray actor prefixes and ``[repeated Nx across cluster]`` markers. Read it as bytes: text
mode would turn every ``\\r`` into a newline.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable

import pytest

from nemo_rl_gke.observe import metrics
from nemo_rl_gke.observe.metrics import (
    LogFollower,
    RunMetrics,
    StepMetrics,
    last_finished_save,
    new_log_text,
    saved_after,
    summary_text,
)
from nemo_rl_gke.observe.redaction import StreamRedactor
from nemo_rl_gke.observe.zero_learning import (
    COLLAPSED,
    CONVERGED,
    NEVER_LEARNED,
    ZeroLearningVerdict,
    check_zero_learning,
)
from nemo_rl_gke.run.spec import RunSpec
from tests.paths import ROOT
from tests.unit.test_redaction import assert_linear

FIXTURE = ROOT / "tests" / "fixtures" / "nemo_rl_grpo.log"
WANDB_URL = "https://wandb.ai/ml-team/nemo-rl/runs/k3x9q2ab"
V1 = "(VllmGenerationWorker pid=2431, ip=10.8.0.12)"
V2 = "(VllmGenerationWorker pid=2467, ip=10.8.0.12)"

# What the fixture prints for each step, written out by hand from the log text.
EXPECTED_STEPS = [
    {
        "step": 1,
        "total_steps": 4,
        "epoch": 1,
        "loss": 0.0421,
        "kl_error": 0.0012,
        "avg_reward": 0.3867,
        "avg_filtered_reward": None,
        "mean_gen_length": 241.5312,
        "total_step_time_s": 118.64,
        "phase_times_s": {
            "generation": 52.31,
            "policy_training": 38.95,
            "policy_and_reference_logprobs": 14.27,
            "prepare_for_generation/total": 6.02,
            "reward_calculation": 0.91,
            "data_processing": 0.44,
        },
        "e2e_samples_per_s_per_gpu": 0.27,
        "e2e_tokens_per_s_per_gpu": 97.64,
        "group_tokens_per_s_per_gpu": {
            "Policy Training": 594.80,
            "Policy and Reference Logprobs": 1623.51,
            "Training Worker Group": 435.32,
            "Generation Worker Group": 442.89,
        },
        "group_tokens_per_s": {
            "E2E": 1562.20,
            "Training Worker Group": 3482.53,
            "Generation Worker Group": 3543.11,
        },
        "val_accuracy": None,
        "checkpoint_step": None,
    },
    {
        "step": 2,
        "total_steps": 4,
        "epoch": 1,
        "loss": -0.0137,
        "kl_error": 0.0009,
        "avg_reward": 0.4512,
        "avg_filtered_reward": None,
        "mean_gen_length": 233.0938,
        "total_step_time_s": 161.72,
        "phase_times_s": {
            "generation": 50.87,
            "policy_training": 38.41,
            "checkpointing": 44.06,
            "policy_and_reference_logprobs": 14.02,
            "prepare_for_generation/total": 5.97,
            "reward_calculation": 0.88,
            "data_processing": 0.41,
        },
        "e2e_samples_per_s_per_gpu": 0.20,
        "e2e_tokens_per_s_per_gpu": 69.96,
        "group_tokens_per_s_per_gpu": {
            "Policy Training": 589.12,
            "Policy and Reference Logprobs": 1613.99,
            "Training Worker Group": 431.59,
            "Generation Worker Group": 444.82,
        },
        "group_tokens_per_s": {
            "E2E": 1119.37,
            "Training Worker Group": 3452.70,
            "Generation Worker Group": 3558.58,
        },
        "val_accuracy": 0.4587,
        "checkpoint_step": 2,
    },
    {
        "step": 3,
        "total_steps": 4,
        "epoch": 1,
        "loss": 0.0088,
        "kl_error": 0.0011,
        "avg_reward": 0.5893,
        "avg_filtered_reward": None,
        "mean_gen_length": 219.8750,
        "total_step_time_s": 110.35,
        "phase_times_s": {
            "generation": 47.12,
            "policy_training": 37.96,
            "policy_and_reference_logprobs": 13.84,
            "prepare_for_generation/total": 5.99,
            "reward_calculation": 0.86,
            "data_processing": 0.43,
        },
        "e2e_samples_per_s_per_gpu": 0.29,
        "e2e_tokens_per_s_per_gpu": 98.50,
        "group_tokens_per_s_per_gpu": {
            "Policy Training": 572.68,
            "Policy and Reference Logprobs": 1570.72,
            "Training Worker Group": 419.67,
            "Generation Worker Group": 461.35,
        },
        "group_tokens_per_s": {
            "E2E": 1575.99,
            "Training Worker Group": 3357.34,
            "Generation Worker Group": 3690.79,
        },
        "val_accuracy": None,
        "checkpoint_step": None,
    },
    {
        "step": 4,
        "total_steps": 4,
        "epoch": 1,
        "loss": 0.0015,
        "kl_error": 0.0010,
        "avg_reward": 0.5625,
        "avg_filtered_reward": None,
        "mean_gen_length": 210.4062,
        "total_step_time_s": 158.90,
        "phase_times_s": {
            "generation": 45.73,
            "policy_training": 37.58,
            "checkpointing": 45.27,
            "policy_and_reference_logprobs": 13.71,
            "prepare_for_generation/total": 6.01,
            "reward_calculation": 0.84,
            "data_processing": 0.40,
        },
        "e2e_samples_per_s_per_gpu": 0.20,
        "e2e_tokens_per_s_per_gpu": 66.55,
        "group_tokens_per_s_per_gpu": {
            "Policy Training": 562.82,
            "Policy and Reference Logprobs": 1542.73,
            "Training Worker Group": 412.38,
            "Generation Worker Group": 462.52,
        },
        "group_tokens_per_s": {
            "E2E": 1064.86,
            "Training Worker Group": 3299.03,
            "Generation Worker Group": 3700.13,
        },
        "val_accuracy": 0.5011,
        "checkpoint_step": 4,
    },
]


def fixture_text() -> str:
    text = FIXTURE.read_bytes().decode("utf-8")
    # The raw bytes are the point: a checkout or editor that normalises line endings breaks the fixture.
    assert "\r" in text and "\x1b[" in text and "[repeated " in text
    return text


def follow_whole(text: str, **kwargs) -> tuple[LogFollower, list[str]]:
    follower = LogFollower(**kwargs)
    lines = follower.feed(text) + follower.flush()
    return follower, lines


def follow_chunks(text: str, seed: int, max_chunk: int = 50) -> tuple[LogFollower, list[str]]:
    rng = random.Random(seed)
    follower = LogFollower()
    lines: list[str] = []
    pos = 0
    while pos < len(text):
        size = rng.randint(1, max_chunk)
        lines += follower.feed(text[pos : pos + size])
        pos += size
    return follower, lines + follower.flush()


def display(text: str, **kwargs) -> list[str]:
    return follow_whole(text, **kwargs)[1]


# --- step metrics -----------------------------------------------------------------------------------------------


def test_every_step_is_extracted_exactly() -> None:
    follower, _ = follow_whole(fixture_text())
    assert [s.to_dict() for s in follower.metrics.steps] == EXPECTED_STEPS


def test_run_level_metrics() -> None:
    run = follow_whole(fixture_text())[0].metrics
    assert run.wandb_url == WANDB_URL
    assert run.checkpoints == [2, 4]
    assert run.initial_val_accuracy == 0.4124
    assert [s.label for s in run.completed_steps] == ["1/4", "2/4", "3/4", "4/4"]


def test_metric_lines_with_actor_prefix_colour_and_repeat_marker() -> None:
    advice = "(Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see x.)"
    log = (
        "========== Step 1/2 ==========\n"
        "\x1b[2m\x1b[36m(DTensorPolicyWorker[rank=0] pid=7, ip=10.0.0.5)\x1b[0m 📊 Training Results:\n"
        "(DTensorPolicyWorker[rank=0] pid=7, ip=10.0.0.5)   • Loss: 0.5000\n"
        f"(pid=8)   • Avg Reward: 0.2500 [repeated 3x across cluster] {advice}\n"
        "(raylet) unrelated\n"
        "  • Mean Generation Length: 12.5000\n"
    )
    follower, lines = follow_whole(log)
    step = follower.metrics.steps[0]
    assert (step.loss, step.avg_reward, step.mean_gen_length) == (0.5, 0.25, 12.5)
    assert lines[1] == "(DTensorPolicyWorker[rank=0] pid=7, ip=10.0.0.5) 📊 Training Results:"
    assert lines[3] == "(pid=8)   • Avg Reward: 0.2500 [repeated 3x across cluster]"


def test_bullets_outside_their_section_are_ignored() -> None:
    log = (
        "===== Step 1/1 =====\n"
        "  • Loss: 9.0000\n"  # no "Training Results:" header yet
        "⏱️  Validation Timing:\n"
        "    • Total validation time: 47.02s\n"
        "▶ Worker Initialization Timing:\n"
        "  • Total step time: 3.00s\n"
        "    - E2E (Tokens/sec/gpu): 5.00\n"  # no "Performance Metrics:" header
    )
    step = follow_whole(log)[0].metrics.steps[0]
    assert (step.loss, step.total_step_time_s, step.e2e_tokens_per_s_per_gpu) == (None, None, None)
    assert not step.completed


def test_dynamic_sampling_reprinted_header_and_draft_loss() -> None:
    log = (
        "===== Step 1/3 =====\n"
        "▶ Preparing batch...\n"
        "===== Step 1/3 =====\n"  # dynamic sampling regenerated the batch: still step 1
        "📊 Training Results:\n"
        "  • Loss: 0.1000\n"
        "  • Draft Loss: 0.9000\n"
        "  • Generation KL Error: 0.0100\n"
        "  • Avg Filtered Reward: 0.5000\n"
        "  • Avg Total Reward: 0.3000\n"
        "  • Mean Generation Length: 100.0000\n"
    )
    steps = follow_whole(log)[0].metrics.steps
    assert len(steps) == 1
    assert (steps[0].loss, steps[0].avg_reward, steps[0].avg_filtered_reward) == (0.1, 0.3, 0.5)


def test_steps_of_different_epochs_are_kept_apart() -> None:
    log = "".join(
        f"===== Epoch {e}/2 =====\n"
        + "".join(f"===== Step {k}/2 =====\n📊 Training Results:\n  • Loss: 0.{e}{k}00\n" for k in (1, 2))
        for e in (1, 2)
    )
    steps = follow_whole(log)[0].metrics.steps
    assert [(s.epoch, s.step, s.loss) for s in steps] == [(1, 1, 0.11), (1, 2, 0.12), (2, 1, 0.21), (2, 2, 0.22)]


def test_nan_loss_is_kept() -> None:
    step = follow_whole("===== Step 1/1 =====\n📊 Training Results:\n  • Loss: nan\n")[0].metrics.steps[0]
    assert step.loss is not None and math.isnan(step.loss)
    assert step.completed


@pytest.mark.parametrize(
    ("line", "url"),
    [
        ("wandb: 🚀 View run at https://wandb.ai/e/p/runs/abc", "https://wandb.ai/e/p/runs/abc"),
        ("wandb: 🚀 View run my-run at: https://wandb.ai/e/p/runs/abc", "https://wandb.ai/e/p/runs/abc"),
        ("wandb: View run at https://wandb.example.com/e/p/runs/abc", "https://wandb.example.com/e/p/runs/abc"),
        (
            "wandb: 🚀 View run \x1b[33mr\x1b[0m at: \x1b[34m\x1b[4mhttps://wandb.ai/e/p/x\x1b[0m",
            "https://wandb.ai/e/p/x",
        ),
        ("wandb: ⭐️ View project at https://wandb.ai/e/p", None),
        ("wandb: Syncing run my-run", None),
        ("see https://wandb.ai/e/p/runs/abc", None),
    ],
)
def test_wandb_url(line: str, url: str | None) -> None:
    run = RunMetrics()
    run.parse_line(line)
    assert run.wandb_url == url


def test_first_wandb_url_wins() -> None:
    run = RunMetrics()
    run.parse_line("wandb: 🚀 View run at https://wandb.ai/e/p/runs/first")
    run.parse_line("wandb: 🚀 View run r at: https://wandb.ai/e/p/runs/second")
    assert run.wandb_url == "https://wandb.ai/e/p/runs/first"


# --- chunking and offsets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_chunks_give_the_same_result_as_one_chunk(seed: int) -> None:
    text = fixture_text()
    whole, whole_lines = follow_whole(text)
    chunked, chunked_lines = follow_chunks(text, seed)
    assert chunked_lines == whole_lines
    assert chunked.metrics.to_dict() == whole.metrics.to_dict()
    assert chunked.tail(40) == whole.tail(40)
    assert chunked.lines_emitted == whole.lines_emitted == len(whole_lines)


def test_one_character_chunks() -> None:
    text = fixture_text()
    follower = LogFollower()
    lines = [line for ch in text for line in follower.feed(ch)] + follower.flush()
    assert lines == display(text)
    assert [s.to_dict() for s in follower.metrics.steps] == EXPECTED_STEPS


def test_crlf_split_between_chunks() -> None:
    follower = LogFollower()
    assert follower.feed("a\r") == ["a"]
    assert follower.feed("\nb\r\n") == ["b"]
    assert follower.flush() == []


def test_new_log_text() -> None:
    assert new_log_text("", 0) == ("", 0)
    assert new_log_text("abc", 0) == ("abc", 3)
    assert new_log_text("abcdef", 3) == ("def", 6)
    assert new_log_text("abc", 3) == ("", 3)
    assert new_log_text("xy", 5) == ("xy", 2)  # a shorter log is a new log
    with pytest.raises(ValueError, match="offset"):
        new_log_text("abc", -1)


@pytest.mark.parametrize("seed", range(3))
def test_whole_log_polls_give_the_same_result_as_one_chunk(seed: int) -> None:
    text = fixture_text()
    rng = random.Random(seed)
    cuts = [*sorted(rng.sample(range(1, len(text)), 40)), len(text), len(text)]
    follower = LogFollower()
    lines: list[str] = []
    for cut in cuts:  # each poll returns the whole log so far, as GET /api/jobs/{id}/logs does
        lines += follower.feed_full_log(text[:cut])
    lines += follower.flush()
    assert follower.offset == len(text)
    assert lines == display(text)
    assert [s.to_dict() for s in follower.metrics.steps] == EXPECTED_STEPS


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.8])
def test_catch_up_resumes_without_repeating_lines(fraction: float) -> None:
    text = fixture_text()
    offset = int(len(text) * fraction)
    first = LogFollower()
    shown = first.feed_full_log(text[:offset])
    resumed = LogFollower()
    resumed.catch_up(text, offset)
    assert resumed.lines_emitted == len(shown)
    rest = resumed.feed_full_log(text) + resumed.flush()
    assert shown + rest == display(text)
    assert [s.to_dict() for s in resumed.metrics.steps] == EXPECTED_STEPS


def test_replaced_log_is_read_again() -> None:
    follower = LogFollower()
    assert follower.feed_full_log("one\ntwo\nhalf") == ["one", "two"]
    assert follower.feed_full_log("new\n") == ["new"]  # shorter: a new log, the old partial line is dropped
    assert follower.offset == 4


# --- display lines ----------------------------------------------------------------------------------------------


def test_progress_bars_are_collapsed() -> None:
    text = fixture_text()
    lines = display(text)
    assert text.count("Processed prompts") == 112
    bar_lines = [line for line in lines if "Processed prompts" in line]
    # one line per bar: initial validation, 4 steps and 2 validations, each on two vLLM workers
    assert len(bar_lines) == 14
    assert all(re.search(r"\| (\d+)/\1 \[", line) for line in bar_lines)  # each shown at its completed state
    assert sum(line.startswith(V1) for line in bar_lines) == sum(line.startswith(V2) for line in bar_lines) == 7
    loading = [line for line in lines if "Loading safetensors" in line]
    assert text.count("Loading safetensors") == 17
    assert loading == [
        f"{V1} Loading safetensors checkpoint shards: 100% Completed | 12/12 [00:24<00:00, 2.31s/it]",
        f"{V2} Loading safetensors checkpoint shards: 100% Completed | 12/12 [00:25<00:00,  2.09s/it]"
        " [repeated 2x across cluster]",
    ]
    assert [line for line in lines if line.startswith("Map:")] == [
        "Map: 100%|██████████| 7473/7473 [00:00<00:00, 21803.12 examples/s]"
    ]
    assert not any("\r" in line or "\x1b" in line or "RAY_DEDUP_LOGS" in line for line in lines)


def test_display_line_count() -> None:
    text = fixture_text()
    physical = text.split("\n")[:-1]
    bars = [line for line in physical if "%|" in line or "% Completed |" in line]
    blank = [line for line in physical if not re.sub(r"^\([^()]*pid=[^()]*\)", "", line).strip()]
    # every other line shows once; the bar lines collapse to 14 "Processed prompts", 2 "Loading", 1 "Map", 1 "Adding"
    assert len(display(text)) == len(physical) - len(bars) - len(blank) + 14 + 2 + 1 + 1


def test_bar_completion_and_repaint() -> None:
    log = "a\nP:   0%|  | 0/4 [x]\rP:  50%|█ | 2/4 [y]\rP: 100%|██| 4/4 [z]\rP: 100%|██| 4/4 [z2]\nb\n"
    assert display(log) == ["a", "P: 100%|██| 4/4 [z]", "b"]


def test_bar_redrawn_on_separate_lines() -> None:
    log = (
        "L:   0% Completed | 0/2 [a]\n"
        "L:  50% Completed | 1/2 [b]\n"
        "L: 100% Completed | 2/2 [c]\n"
        "L: 100% Completed | 2/2 [d]\n"  # vLLM's close() prints the final state once more
    )
    assert display(log) == ["L: 100% Completed | 2/2 [c]"]


def test_each_round_of_a_bar_shows_once() -> None:
    one_round = "(W pid=1) P:   0%|  | 0/4 [x]\rP: 100%|██| 4/4 [z]\n"
    assert display("x\n" + one_round + "y\n" + one_round) == [
        "x",
        "(W pid=1) P: 100%|██| 4/4 [z]",
        "y",
        "(W pid=1) P: 100%|██| 4/4 [z]",
    ]


def test_abandoned_bar_shows_its_last_state() -> None:
    follower = LogFollower()
    assert follower.feed("P:  10%|█   | 1/10\rP:  30%|██  | 3/10\n") == []
    assert follower.feed("P:   0%|    | 0/10\rP:  20%|█   | 2/10\n") == ["P:  30%|██  | 3/10"]
    assert follower.flush() == ["P:  20%|█   | 2/10"]


def test_bars_of_different_actors_are_tracked_apart() -> None:
    log = (
        "(W pid=1) P:   0%|  | 0/2\n"
        "(W pid=2) P:   0%|  | 0/4\n"
        "(W pid=1) P:  50%|█ | 1/2\n"
        "(W pid=2) P: 100%|██| 4/4\n"
        "(W pid=1) P: 100%|██| 2/2\n"
    )
    assert display(log) == ["(W pid=2) P: 100%|██| 4/4", "(W pid=1) P: 100%|██| 2/2"]


def test_unit_scaled_bar_and_cleared_bar() -> None:
    log = (
        "D:  40%|████      | 1.99G/4.97G [00:25<00:37, 80.1MB/s]\r"
        "D: 100%|██████████| 4.97G/4.97G [01:02<00:00, 80.1MB/s]\r"
        "          \r\n"  # tqdm(leave=False) blanks the line when it closes
    )
    assert display(log) == ["D: 100%|██████████| 4.97G/4.97G [01:02<00:00, 80.1MB/s]"]


def test_flush_emits_the_unterminated_line_and_parses_it() -> None:
    follower = LogFollower()
    assert follower.feed("===== Step 1/1 =====\nSaving checkpoint for step 1...") == ["===== Step 1/1 ====="]
    assert follower.metrics.checkpoints == []
    assert follower.flush() == ["Saving checkpoint for step 1..."]
    assert follower.metrics.checkpoints == [1]
    assert follower.metrics.steps[0].checkpoint_step == 1
    assert follower.flush() == []


def test_long_lines_are_shortened() -> None:
    assert display("x" * 25 + "\n", max_line_chars=10) == ["xxxxxxxxxx… [15 more chars]"]


def test_runaway_line_is_cut_into_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_MAX_SEGMENT_CHARS", 100)
    follower = LogFollower()
    assert follower.feed("y" * 250) == ["y" * 100, "y" * 100]  # before any line end arrives
    assert follower.flush() == ["y" * 50]
    text = "a\n" + "y" * 250 + "\nb\n"
    expected = ["a", "y" * 100, "y" * 100, "y" * 50, "b"]
    assert display(text) == expected
    for seed in range(3):
        assert follow_chunks(text, seed, max_chunk=30)[1] == expected


def test_constructor_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="tail_size"):
        LogFollower(tail_size=0)
    with pytest.raises(ValueError, match="max_line_chars"):
        LogFollower(max_line_chars=0)


# --- tail -------------------------------------------------------------------------------------------------------


def test_tail_is_the_last_display_lines() -> None:
    follower, lines = follow_whole(fixture_text(), tail_size=50)
    assert follower.tail(5) == lines[-5:]
    assert follower.tail(1)[0].startswith("wandb: Find logs at: /opt/nemo-rl/logs/exp_001/")
    assert follower.tail(1000) == lines[-50:]  # at most tail_size
    assert follower.tail(0) == []


def test_tail_shows_a_running_bar_and_the_unterminated_line() -> None:
    follower = LogFollower()
    follower.feed("done\n(W pid=1) P:  10%|█   | 1/10\rP:  30%|██  | 3/10\ncrashed: CUDA error: out of mem")
    assert follower.tail(3) == ["done", "(W pid=1) P:  30%|██  | 3/10", "crashed: CUDA error: out of mem"]
    assert follower.lines_emitted == 1  # tail() emits nothing


def test_tail_of_an_unterminated_bar_redraw_keeps_its_actor() -> None:
    follower = LogFollower()
    follower.feed("(W pid=1) x\r(partial")
    assert follower.tail(2) == ["(W pid=1) x", "(W pid=1) (partial"]


# --- summary ----------------------------------------------------------------------------------------------------


def test_summary() -> None:
    run = follow_whole(fixture_text())[0].metrics
    assert run.summary() == {
        "steps_completed": 4,
        "last_step": "4/4",
        "first_reward": 0.3867,
        "last_reward": 0.5625,
        "best_reward": 0.5893,
        "best_reward_step": "3/4",
        "mean_step_time_s": pytest.approx((118.64 + 161.72 + 110.35 + 158.90) / 4),
        "mean_e2e_tokens_per_s_per_gpu": pytest.approx((97.64 + 69.96 + 98.50 + 66.55) / 4),
        "mean_e2e_tokens_per_s": pytest.approx((1562.20 + 1119.37 + 1575.99 + 1064.86) / 4),
        "initial_val_accuracy": 0.4124,
        "final_val_accuracy": 0.5011,
        "checkpoints": [2, 4],
        "wandb_url": WANDB_URL,
    }
    # "SETUP COMPLETE" / "Total setup time: 231.5s": where NeMo RL's checkpoint_must_save_by clock starts.
    assert run.setup_complete and run.setup_s == 231.5
    text = summary_text(run.summary())
    for part in (
        "4 GRPO step(s) completed (last 4/4)",
        "avg reward 0.3867 -> 0.5625 (best 0.5893 at step 3/4)",
        "mean step time 137.4s",
        "E2E 83.2 tokens/s/GPU",
        "validation accuracy 0.4124 -> 0.5011",
        "checkpoints at step(s) 2, 4",
        WANDB_URL,
    ):
        assert part in text


def test_summary_of_a_run_that_stopped_mid_step() -> None:
    text = fixture_text()
    follower = LogFollower()
    follower.feed(text[: text.index("⏱️  Timing:", text.index("Step 3/4"))])
    summary = follower.metrics.summary()
    # step 3 printed its training results, not its timing: completed, but without a step time
    assert (summary["steps_completed"], summary["last_step"], summary["final_val_accuracy"]) == (3, "3/4", 0.4587)
    assert summary["mean_step_time_s"] == pytest.approx((118.64 + 161.72) / 2)
    assert summary["checkpoints"] == [2]


def test_the_job_sensor_summary_counts_the_whole_log_not_the_trigger_view_at_the_stop() -> None:
    # The trigger's summary is of the log when it stopped the job; the job trained on until the stop landed. The
    # table and the summary the sensor pushes both count the whole log's steps.
    from nemo_rl_gke.operators.rayjob import RayJobSensor
    from nemo_rl_gke.run.topology import WAIT

    text = fixture_text()
    at_stop = LogFollower()
    at_stop.feed(text[: text.index("Step 3/4")])
    whole = follow_whole(text)[0].metrics
    sensor = RayJobSensor(step=WAIT)
    rows, summary = sensor._run_steps(RunSpec(), whole, [], {**at_stop.metrics.summary(), "extra": 1})
    assert at_stop.metrics.summary()["steps_completed"] == 2
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert (summary["steps_completed"], summary["last_step"], summary["checkpoints"], summary["extra"]) == (
        4,
        "4/4",
        [2, 4],
        1,
    )
    # An unreadable log leaves the trigger's summary as it was.
    assert sensor._run_steps(RunSpec(), None, [], {"steps_completed": 2}) == ([], {"steps_completed": 2})


def test_summary_of_an_empty_log() -> None:
    run = RunMetrics()
    summary = run.summary()
    assert summary["steps_completed"] == 0
    assert all(summary[k] is None for k in ("last_step", "first_reward", "best_reward", "mean_step_time_s"))
    assert summary_text(run.summary()) == "no GRPO step completed"


def test_to_dict_is_json_and_round_trips() -> None:
    run = follow_whole(fixture_text())[0].metrics
    data = json.loads(json.dumps(run.to_dict()))
    assert RunMetrics.from_dict(data).to_dict() == run.to_dict()
    assert RunMetrics.from_dict(data).summary() == run.summary()
    assert StepMetrics.from_dict({**EXPECTED_STEPS[0], "added_later": 1}).to_dict() == EXPECTED_STEPS[0]
    json.dumps(run.summary())


# --- zero-learning guard ----------------------------------------------------------------------------------------


def steps_with(rewards: list[float], losses: list[float] | None = None) -> list[StepMetrics]:
    losses = losses if losses is not None else [0.01] * len(rewards)
    n = len(rewards)
    return [
        StepMetrics(step=i, total_steps=n, loss=loss, avg_reward=reward)
        for i, (reward, loss) in enumerate(zip(rewards, losses, strict=True), 1)
    ]


def test_guard_stops_a_run_that_never_learned() -> None:
    verdict = check_zero_learning(steps_with([0.0, 0.0, 0.0, 0.0]), 3)
    assert isinstance(verdict, ZeroLearningVerdict)
    assert (verdict.kind, verdict.stops_now) == (NEVER_LEARNED, True)
    # The whole streak is reported; the decision was made at its K-th step.
    assert verdict.steps == ("1/4", "2/4", "3/4", "4/4")
    assert (verdict.decided_at, verdict.decided_index) == ("3/4", 2)
    assert verdict.avg_rewards == (0.0, 0.0, 0.0, 0.0)
    assert verdict.k == 3
    for part in (
        "Zero-learning guard (K=3): 4 completed GRPO step(s) in a row",
        "from the job's first step",
        "steps 1/4, 2/4, 3/4, 4/4",
        "Avg Reward: 0.0000, 0.0000, 0.0000, 0.0000",
        "reward minus the mean reward of its prompt's group",
        "policy gradient is 0",
        "wraps the ground truth in \\boxed{}",
        "'#### N'",
        "full worked solution",
        "too hard",
        "zero_learning_guard",
        "zero_learning_steps (now 3)",
    ):
        assert part in verdict.message
    assert "too easy" not in verdict.message and "converged" not in verdict.message


def test_guard_calls_all_ones_from_the_start_too_easy_not_converged() -> None:
    verdict = check_zero_learning(steps_with([1.0, 1.0]), 2)
    assert verdict is not None and verdict.kind == NEVER_LEARNED and verdict.stops_now
    assert "too easy" in verdict.message
    assert "\\boxed{}" not in verdict.message


def test_guard_lets_a_run_that_learned_and_converged_reach_its_next_save() -> None:
    verdict = check_zero_learning(steps_with([0.4, 1.0, 1.0]), 2)
    assert verdict is not None
    assert (verdict.kind, verdict.stops_now) == (CONVERGED, False)
    assert verdict.steps == ("2/3", "3/3") and verdict.decided_at == "3/3"
    assert "converged at step 3/3" in verdict.message and "next checkpoint save" in verdict.message
    # Uniform per-prompt groups (loss exactly 0) at a middling reward after learning: converged too.
    partial = check_zero_learning(steps_with([0.2, 0.6, 0.7, 0.7], [0.1, 0.1, 0.0, 0.0]), 2)
    assert partial is not None and partial.kind == CONVERGED


def test_guard_stops_a_run_whose_rewards_collapsed_to_zero() -> None:
    verdict = check_zero_learning(steps_with([0.3, 0.0, 0.0, 0.0]), 3)
    assert verdict is not None
    assert (verdict.kind, verdict.stops_now) == (COLLAPSED, True)
    assert verdict.steps == ("2/4", "3/4", "4/4")
    assert "collapsed" in verdict.message and "after steps that had one" in verdict.message


def test_guard_treats_a_resumed_job_as_one_that_learned_before() -> None:
    # A job that resumed from a checkpoint starts past step 1: what came before it is not in its log.
    resumed = [StepMetrics(step=i, total_steps=20, epoch=1, loss=0.01, avg_reward=1.0) for i in (11, 12, 13)]
    verdict = check_zero_learning(resumed, 3)
    assert verdict is not None and verdict.kind == CONVERGED
    second_epoch = [StepMetrics(step=1, total_steps=5, epoch=2, loss=0.01, avg_reward=0.0) for _ in range(3)]
    verdict = check_zero_learning(second_epoch, 3)
    assert verdict is not None and verdict.kind == COLLAPSED


def test_saved_after_waits_for_the_save_to_finish() -> None:
    steps = steps_with([0.4, 1.0, 1.0, 1.0, 1.0])
    verdict = check_zero_learning(steps, 2)
    assert verdict is not None and verdict.decided_index == 2
    assert saved_after(steps, verdict.decided_index) is None
    steps[3].checkpoint_step = 4
    # The save line of step 4 is printed; the save is done only when step 5 starts.
    assert saved_after(steps[:4], verdict.decided_index) is None
    assert saved_after(steps, verdict.decided_index) == 4
    # The stop may land later than asked: the newest save that finished is what the job left.
    steps.append(StepMetrics(step=6, total_steps=5, loss=0.01, avg_reward=1.0))
    steps[4].checkpoint_step = 5
    assert last_finished_save(steps) == 5 and last_finished_save(steps[:5]) == 4
    assert last_finished_save(steps_with([0.5])) is None
    # A save before the decision does not count: the steps since it would be lost.
    early = steps_with([0.4, 1.0, 1.0, 1.0])
    early[1].checkpoint_step = 2
    assert saved_after(early, 2) is None


def test_guard_triggers_on_k_zero_losses() -> None:
    verdict = check_zero_learning(steps_with([0.3, 0.4, 0.5], [0.0, 0.0, -0.0]), 3)
    assert verdict is not None
    assert verdict.losses == (0.0, 0.0, 0.0)
    assert "loss of exactly 0 while the Avg Reward varies" in verdict.message


def test_guard_counts_zeros_and_ones_together() -> None:
    verdict = check_zero_learning(steps_with([0.0, 1.0, 0.0]), 3)
    assert verdict is not None and verdict.kind == NEVER_LEARNED
    assert "\\boxed{}" in verdict.message and "too easy" in verdict.message


def test_guard_needs_k_steps() -> None:
    assert check_zero_learning(steps_with([0.3, 0.0, 0.0]), 3) is None
    assert check_zero_learning(steps_with([0.0, 0.0]), 3) is None
    assert check_zero_learning([], 1) is None


def test_guard_respects_k() -> None:
    zeros = steps_with([0.0] * 5)
    assert check_zero_learning(zeros, 5) is not None
    assert check_zero_learning(zeros, 6) is None
    one = check_zero_learning(steps_with([0.5, 0.0]), 1)
    assert one is not None and one.steps == ("2/2",)
    assert len(check_zero_learning(zeros, 2).steps) == 5  # the whole trailing streak is reported


def test_guard_leaves_learning_runs_alone() -> None:
    assert check_zero_learning(steps_with([0.1, 0.2, 0.3, 0.4]), 1) is None
    assert check_zero_learning(steps_with([0.0001, 0.9999, 0.5]), 1) is None
    assert check_zero_learning(steps_with([0.0, 0.0, 0.0, 0.2]), 3) is None  # recovered
    assert check_zero_learning(steps_with([0.0, 0.0, 0.0], [0.1, 0.0, 0.1]), 1) is not None


def test_guard_skips_a_step_still_running() -> None:
    steps = [*steps_with([0.0, 0.0, 0.0]), StepMetrics(step=4, total_steps=4)]
    verdict = check_zero_learning(steps, 3)
    assert verdict is not None and verdict.steps == ("1/3", "2/3", "3/3")


@pytest.mark.parametrize("k", [0, -1, True, 2.0, "3"])
def test_guard_rejects_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match="k must be"):
        check_zero_learning(steps_with([0.0]), k)  # type: ignore[arg-type]


def test_guard_on_the_fixture() -> None:
    steps = follow_whole(fixture_text())[0].metrics.steps
    assert check_zero_learning(steps, 1) is None
    # the same log with a grader that never matches
    zero = re.sub(r"Avg Reward: [\d.]+", "Avg Reward: 0.0000", fixture_text())
    steps = follow_whole(zero)[0].metrics.steps
    verdict = check_zero_learning(steps, 4)
    assert verdict is not None and verdict.steps == ("1/4", "2/4", "3/4", "4/4")
    assert check_zero_learning(steps, 5) is None
    assert json.loads(json.dumps(verdict.to_dict()))["steps"] == ["1/4", "2/4", "3/4", "4/4"]


# --- hostile driver logs: nothing raises, nothing is slower than linear --------------------------------------------
# The follower runs in the triggerer, shared by every deferred task: one line must not stall it or make it raise.


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


# Each shape is an n-character line built to make a backtracking pattern rescan it (the old bar and bullet patterns
# were cubic on spaces, the repeat marker and the W&B link quadratic) or to overflow a number conversion.
ADVERSARIAL_LINES: dict[str, Callable[[int], str]] = {
    "spaces then a percent": lambda n: "a" + " " * n + "1%",
    "spaces then a bare percent": lambda n: "a" + " " * n + "%",
    "digits in a step header": lambda n: "===== Step " + "1" * n + "/2 =====",
    "digits": lambda n: "1" * n,
    "= runs": lambda n: "=" * n + " Step 1/2 =x",
    "bullet and colons": lambda n: "•" + _repeat(": ", n),
    "bullet and spaces": lambda n: "•" + " " * n + "x",
    "ANSI-like escapes": lambda n: _repeat("\x1b[0", n),
    "OSC escapes": lambda n: _repeat("\x1b]8;;x", n),
    "(pid= repeated": lambda n: _repeat("(pid=", n),
    "Ray prefix parts": lambda n: "(" + _repeat(" pid=a, ip=b", n),
    "spaces before a repeat marker": lambda n: " " * n + "[repeated 1x across cluster]x",
    "repeat markers and advice": lambda n: _repeat(
        "x [repeated 2x across cluster] (Ray deduplicates logs by default ", n
    ),
    "View run repeated": lambda n: "wandb: " + _repeat("View run ", n),
    "throughput spaces": lambda n: "-" + " " * n + "x",
    "throughput units": lambda n: "- " + _repeat("(Tokens/sec) ", n),
    "percent bars": lambda n: _repeat("1%|", n),
    "percent Completed": lambda n: "x: 1%" + _repeat(" |1% Completed ", n),
    "validation step digits": lambda n: "Starting validation at step " + "1" * n,
    "huge float": lambda n: "  • Loss: " + "1" * (n // 3) + "." + "1" * (n // 3) + "e" + "1" * (n // 3),
}


def _follow_line(line: str) -> None:
    """The follower's whole path for one line, inside a step and a section, plus RunMetrics.parse_line."""
    follower = LogFollower()
    follower.feed("===== Step 1/2 =====\n⏱️  Timing:\n")
    follower.feed(line + "\n")
    follower.feed(line)
    follower.tail(5)
    follower.flush()
    run = RunMetrics()
    run.steps.append(StepMetrics(step=1, total_steps=2))
    for section in ("train", "perf", "val"):
        run._section = section
        run.parse_line(line)


@pytest.mark.parametrize("shape", ADVERSARIAL_LINES)
def test_adversarial_lines_do_not_raise(shape: str) -> None:
    for n in (1000, 5000):
        _follow_line(ADVERSARIAL_LINES[shape](n))


@pytest.mark.parametrize("shape", ADVERSARIAL_LINES)
def test_follower_is_linear_on_adversarial_lines(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Parse lines of any length here: the ratio must hold for every pattern, not only thanks to the length cut.
    monkeypatch.setattr(metrics, "MAX_PARSE_CHARS", 10**9, raising=False)
    print(shape, assert_linear(_follow_line, ADVERSARIAL_LINES[shape], (256, 20000)))


def test_huge_numbers_are_ignored_not_raised() -> None:
    digits = "9" * 5000  # int() refuses more than 4,300 digits
    log = (
        f"===== Epoch {digits}/2 =====\n"
        f"===== Step {digits}/2 =====\n"
        "===== Step 1/2 =====\n"
        f"▶ Starting validation at step {digits}...\n"
        f"Saving checkpoint for step {digits}...\n"
        "📊 Training Results:\n"
        f"  • Loss: {digits}.5\n"
        "  • Avg Reward: 0.5000\n"
        "⏱️  Timing:\n"
        f"  • Total step time: {digits}s\n"
        f"  • generation: {digits}s (50.0%)\n"
        "🔍 Performance Metrics:\n"
        f"    - E2E (Tokens/sec/gpu): {digits}\n"
        f"P:  50%|█ | {digits}/{digits}9\n"
    )
    follower, lines = follow_whole(log)
    [step] = follower.metrics.steps
    assert (step.step, step.epoch, step.loss, step.avg_reward) == (1, None, None, 0.5)
    assert (step.total_step_time_s, step.phase_times_s, step.e2e_tokens_per_s_per_gpu) == (None, {}, None)
    assert follower.metrics.checkpoints == []
    assert f"P:  50%|█ | {digits}/{digits}9"[:2000] in lines[-1]  # not a bar NeMo RL could draw: shown as it is


def test_lines_longer_than_the_parse_limit_are_shown_not_parsed() -> None:
    pad = " " * 5000  # over MAX_PARSE_CHARS
    follower, lines = follow_whole(
        f"===== Step 1/2 =====\n📊 Training Results:\n  • Loss: 0.5{pad}\n  • Avg Reward: 0.25\nwandb: View run at https://w/{pad}x\n"
    )
    assert (follower.metrics.steps[0].loss, follower.metrics.steps[0].avg_reward) == (None, 0.25)
    assert follower.metrics.wandb_url is None
    assert "  • Loss: 0.5" in lines


def test_an_overlong_wandb_url_is_ignored() -> None:
    run = RunMetrics()
    run.parse_line("wandb: 🚀 View run at https://wandb.ai/" + "x" * 3000)
    assert run.wandb_url is None


def test_running_bars_are_bounded() -> None:
    follower = LogFollower()
    lines = follower.feed("".join(f"bar{i}:  10%|█   | 1/10\n" for i in range(300)))
    assert len(follower._bars) == 256
    assert lines == [f"bar{i}:  10%|█   | 1/10" for i in range(44)]  # the oldest count as abandoned


FUZZ_PIECES = [
    "\n",
    "\r",
    "\r\n",
    " ",
    "  ",
    "%",
    "1%",
    "100%",
    "|",
    "█",
    ":",
    "•",
    "=",
    "=====",
    "-",
    "(",
    ")",
    "/",
    ".",
    "e",
    "\x1b[",
    "\x1b[36m",
    "\x1b[0m",
    "\x1b]8;;",
    "\x07",
    "\x1b\\",
    "(pid=",
    "(W pid=1, ip=10.0.0.1) ",
    "(raylet) ",
    " [repeated 3x across cluster]",
    " (Ray deduplicates logs by default. x)",
    "Step ",
    "Epoch ",
    "1/2",
    "Completed",
    "===== Step 1/3 =====",
    "📊 Training Results:",
    "⏱️  Timing:",
    "🔍 Performance Metrics:",
    "Validation Results:",
    "  • Loss: ",
    "  • Avg Reward: ",
    "  • Total step time: ",
    "s",
    "s (",
    "%)",
    "    - E2E (Tokens/sec/gpu): ",
    "(Tokens/sec)",
    "Starting validation at step ",
    "Saving checkpoint for step ",
    "wandb: 🚀 View run at ",
    "https://wandb.ai/e/p/runs/",
    "nan",
    "inf",
    "-1e309",
    "1e-400",
    "0.5",
    "9" * 4400,
    "1_000",
    "٣",
    "\x00",
    "\ufeff",
    "\u2028",
    "\x85",
    "é",
    "🚀",
    "\ud800",
    "k",
    "G",
]


# NeMo RL's own line shapes with hostile numbers in them: huge, signed, non-ASCII digits, exponents, words.
FUZZ_TEMPLATES = [
    "===== Step {0}/{1} =====\n",
    "===== Epoch {0}/{1} =====\n",
    "▶ Starting validation at step {0}...\n",
    "Saving checkpoint for step {0}...\n",
    "  • Loss: {0}\n",
    "  • Total step time: {0}s\n",
    "  • generation: {0}s ({1}%)\n",
    "    - E2E (Tokens/sec/gpu): {0}\n",
    "P: {1}%|█ | {0}/{1} [x]\r",
    "L: {1}% Completed | {0}/{1}k\n",
]
FUZZ_NUMBERS = ["1", "0", "-1", "9" * 4400, "1" * 20, "1e999", "1e-999", "nan", "٣", "1_0", "", " ", "x", "1.5G"]


def _fuzz_text(rng: random.Random, size: int) -> str:
    parts = []
    for _ in range(size):
        if rng.random() < 0.1:
            parts.append(rng.choice(FUZZ_TEMPLATES).format(rng.choice(FUZZ_NUMBERS), rng.choice(FUZZ_NUMBERS)))
        else:
            parts.append(rng.choice(FUZZ_PIECES))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(8))
def test_fuzz_the_follower_never_raises(seed: int) -> None:
    rng = random.Random(seed)
    options: dict = {"tail_size": rng.randint(1, 50), "max_line_chars": rng.randint(1, 200)}
    if seed % 2:
        options["redactor"] = StreamRedactor(["hf_PRINTEDsecret0123456789"])
    follower = LogFollower(**options)
    full = ""
    for _ in range(60):
        action = rng.random()
        if action < 0.5:
            lines = follower.feed(_fuzz_text(rng, rng.randint(0, 40)))
        elif action < 0.9:
            full += _fuzz_text(rng, rng.randint(0, 40))
            if rng.random() < 0.05:
                full = full[: rng.randint(0, len(full))]  # a replaced log
            lines = follower.feed_full_log(full)
        else:
            lines = follower.flush()
        assert all(isinstance(line, str) for line in lines)
        assert all(isinstance(line, str) for line in follower.tail(rng.randint(-1, 60)))
    follower.catch_up(full, rng.randint(0, len(full)))
    follower.flush()
    assert follower.feed(None) == [] and follower.feed_full_log(b"bytes") == []  # type: ignore[arg-type]
    json.dumps(follower.metrics.to_dict())
    summary_text(follower.metrics.summary())
    check_zero_learning(follower.metrics.steps, 1)


@pytest.mark.parametrize("seed", range(3))
def test_a_redacting_follower_shows_a_log_without_secrets_exactly_as_a_plain_one(seed: int) -> None:
    # The secrets share their first characters with the log's words, so text is held back and released again.
    text = fixture_text()
    redactor = StreamRedactor(["Processed-secret-0123456789", "wandb_key_0123456789abcdef", "(VllmGen-x"])
    rng = random.Random(seed)
    follower = LogFollower(redactor=redactor)
    lines: list[str] = []
    pos = 0
    while pos < len(text):
        size = rng.randint(1, 200)
        lines += follower.feed(text[pos : pos + size])
        pos += size
    lines += follower.flush()
    assert lines == display(text)
    assert [s.to_dict() for s in follower.metrics.steps] == EXPECTED_STEPS


def test_a_reopened_stream_resends_the_log_and_each_line_is_shown_once() -> None:
    log = "".join(f"line {k}\n" for k in range(50)) + "partial"
    once = LogFollower()
    expected = once.feed(log) + once.flush()
    follower = LogFollower()
    shown = follower.feed_at(log[:100], 0) + follower.feed_at(log[100:230], 100)
    # The stream breaks; the new one starts again from character 0 and goes on to the end.
    shown += follower.feed_at(log[:150], 0) + follower.feed_at(log[150:], 150)
    shown += follower.feed_at("", len(log)) + follower.flush()
    assert shown == expected and follower.offset == len(log)
