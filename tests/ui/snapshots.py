"""What the training view's tests build snapshots from: a run's task states and train.wait's task log."""

from __future__ import annotations

from nemo_rl_gke.observe.driver_log import JOB_LINE
from nemo_rl_gke.observe.training_view import TaskState
from nemo_rl_gke.run import topology

NOW = 1_800_000_000.0


def task_states(**states: str) -> dict[str, TaskState]:
    """Every step in state ``success`` (started 10 s apart, 5 s long) unless named in ``states``."""
    tasks = {}
    for n, task_id in enumerate(topology.STEPS):
        state = states.get(task_id, "success")
        start = NOW - 3600 + 10 * n
        tasks[task_id] = TaskState(task_id, state, start, None if state in ("running", "deferred") else start + 5)
    return tasks


def attempt_log(submission_id: str, steps: range, total: int, saves: tuple[int, ...], attempt: int) -> list[str]:
    """One attempt's part of train.wait's task log: the trigger's line naming its job, then NeMo RL's step blocks
    (the loss says which attempt printed it)."""
    lines = [f"Following Ray job {submission_id}"]
    for step in steps:
        header = f"{'=' * 25} Step {step}/{total} {'=' * 25}"
        lines += [
            header,
            "📊 Training Results:",
            f"  • Loss: {attempt + step / 100}",
            f"  • Avg Reward: {step / total}",
        ]
        if step in saves:
            lines.append(f"Saving checkpoint for step {step}...")
    return ["Task resumed", *(line if line.startswith("Following") else f"{JOB_LINE}{line}" for line in lines)]
