"""The recovery rules: a lost node is recovered, a bug never is, and each verdict names its rule.

The messages are Ray's own (FACTS §18, seen on a local two-node cluster): a frozen worker's ``ActorDiedError ... its
node has died`` and a killed raylet's ``ActorUnavailableError``.
"""

from __future__ import annotations

import pytest

from nemo_rl_gke.decide.recovery_rules import RULES, classify
from nemo_rl_gke.observe.metrics import StepMetrics
from nemo_rl_gke.observe.recoveries import attempt_id, merge_attempts, recovery_record, resubmitted

RAY_PREFIX = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
ENTRYPOINT_ERROR = "JOB_ENTRYPOINT_COMMAND_ERROR"


@pytest.mark.parametrize(
    ("tail", "rule"),
    [
        (
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: "
            "Grader\nThe actor died because its node has died. Node Id: 3f2a\n\tthe actor's node was terminated: "
            "health check failed due to missing too many heartbeats",
            "node-died",
        ),
        (
            "ray.exceptions.ActorUnavailableError: The actor 9c1 is unavailable: Socket closed rpc_code: 14",
            "actor-unavailable",
        ),
        ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", "actor-died"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
            "nccl-timeout",
        ),
        (
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE)",
            "nccl-timeout",
        ),
        ("The node was preempted (cloud.google.com/impending-node-termination)", "preempted"),
        ("Pod nemo-rl-worker-0 was evicted: The node was low on resource: memory.", "pod-lost"),
    ],
)
def test_a_lost_node_in_any_of_its_forms_is_recoverable_and_names_its_rule(tail: str, rule: str) -> None:
    verdict = classify(ENTRYPOINT_ERROR, RAY_PREFIX + tail, [], steps_completed=7)
    assert (verdict.rule, verdict.recoverable) == (rule, True)
    assert verdict.text().startswith(f"recovery rule '{rule}': recoverable (")


@pytest.mark.parametrize(
    ("tail", "rule"),
    [
        ("grpo_cpu.py: error: 'policy.optimizer.lr' must be a number > 0.0, got -1", "config-error"),
        ("omegaconf.errors.ConfigKeyError: Key 'grpo.bogus' is not in struct", "config-error"),
        ("nemo-rl-gke: not started: resume=none starts from step 0, but checkpoint_dir ...", "lineage-guard"),
        ("ResourceInsufficientError: 2 node(s) x 8 GPUs requested, but the cluster has 8", "gpus-short"),
        ("ZeroDivisionError: division by zero", "no-rule"),
        ("", "no-rule"),
    ],
)
def test_a_bug_is_never_recovered(tail: str, rule: str) -> None:
    verdict = classify(ENTRYPOINT_ERROR, RAY_PREFIX + tail, ["some line"], steps_completed=7)
    assert (verdict.rule, verdict.recoverable) == (rule, False)


def test_a_config_error_wins_over_a_node_loss_named_in_the_same_traceback() -> None:
    tail = ["ray.exceptions.ActorDiedError: ...", "omegaconf.errors.ConfigAttributeError: Missing key foo"]
    assert classify(ENTRYPOINT_ERROR, "failed", tail, steps_completed=3).rule == "config-error"


def test_a_node_lost_before_the_first_step_is_not_recovered() -> None:
    verdict = classify(ENTRYPOINT_ERROR, RAY_PREFIX + "ray.exceptions.ActorDiedError: ...", [], steps_completed=0)
    assert (verdict.rule, verdict.recoverable) == ("before-first-step", False)


def test_the_rules_are_data_with_unique_names_and_something_to_match() -> None:
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    assert all(rule.error_type or rule.exception or rule.pattern for rule in RULES)


def _step(k: int, seconds: float = 2.0, saved: bool = False) -> StepMetrics:
    return StepMetrics(k, 30, loss=0.1, avg_reward=0.5, total_step_time_s=seconds, checkpoint_step=k if saved else None)


def test_a_recovery_counts_the_steps_after_the_newest_save_and_the_wait_as_lost_gpu_time() -> None:
    steps = [_step(k, saved=k % 5 == 0) for k in range(1, 13)]
    record = recovery_record(
        attempt=1, failed_job="job", rule="actor-died", why="w", failed_at=100.0, steps=steps, resumed_from=10, gpus=8
    )
    assert (record["failed_at_step"], record["steps_lost"], record["lost_step_seconds"]) == (12, 2, 4.0)
    done = resubmitted(record, attempt_id("job", 1), at=130.0)
    assert done["submission_id"] == "job-r1" and done["time_to_recover_s"] == 30.0
    assert done["gpu_hours_lost"] == pytest.approx((4.0 + 30.0) * 8 / 3600, abs=1e-6)
    assert attempt_id("job", 0) == "job"


def test_the_attempts_make_one_table_without_the_lost_steps() -> None:
    first = [_step(k) for k in range(1, 13)]
    second = [_step(k) for k in range(11, 21)]
    rows = merge_attempts([first, second], [10])
    assert [(r["step"], r["attempt"]) for r in rows] == [(k, 0) for k in range(1, 11)] + [(k, 1) for k in range(11, 21)]
