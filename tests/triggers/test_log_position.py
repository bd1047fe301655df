"""Where the task log stopped: a trigger logs a job's lines a step at a time and saves the position after each, so a
restarted one (reading the whole log again) logs only what the one before had not, and a kill between a step's
lines and its save repeats that one step, never loses a line (triggers/log_position.py, RayJobTrigger._pieces)."""

from __future__ import annotations

import random

import pytest

from nemo_rl_gke.observe.metrics import LogFollower
from nemo_rl_gke.triggers.log_position import LogPositions
from nemo_rl_gke.triggers.rayjob import RayJobTrigger
from tests.triggers.test_rayjob_event import Recorder

JOB = "nemo-rl-position-1"
STEPS = 6


class MemoryPositions:
    """Where the task log stopped, in memory: what LogPositions keeps in the task's XCom, which only a triggerer or
    ``dag.test`` serves (tests/browser/test_ui.py restarts a real triggerer on the real one)."""

    def __init__(self, log: Recorder | None = None) -> None:
        self.saved: dict[str, tuple[int, int]] = {}
        # Each save: offset, step, the lines it says the task log has, and how many the log held then.
        self.history: list[tuple[int, int, int, int]] = []
        self._log = log

    def load(self, submission_id: str) -> int:
        return self.saved.get(submission_id, (0, 0))[0]

    def save(self, submission_id: str, offset: int, step: int, lines: int) -> None:
        self.saved[submission_id] = (offset, step)
        self.history.append((offset, step, lines, len(self._log.lines) if self._log else 0))


def _log(steps: int = STEPS) -> str:
    """A NeMo RL-shaped log with Ray's actor prefixes (``pid=`` has an ``=`` before the header's)."""
    parts = ["Submitting job with entrypoint python -m examples.run_grpo"]
    for k in range(1, steps + 1):
        parts += [
            f"(GrpoDriver pid=41) ========================= Step {k}/{steps} =========================",
            "(GrpoDriver pid=41) 📊 Training Results:",
            "(GrpoDriver pid=41)   • Loss: 0.0100",
            f"(GrpoDriver pid=41)   • Avg Reward: {k / 10:.4f}",
        ]
        if k % 2 == 0:
            parts.append(f"(GrpoDriver pid=41) Saving checkpoint for step {k}...")
    return "\n".join(parts) + "\n"


def _lines_of(text: str) -> list[str]:
    """What one follower makes of the text fed at once (the reference: chunking never changes it)."""
    return LogFollower().feed(text)


def _trigger(positions: MemoryPositions, recorder: Recorder) -> RayJobTrigger:
    trigger = RayJobTrigger(
        address="http://127.0.0.1:1",
        submission_id=JOB,
        task_key={"dag_id": "d", "run_id": "manual__1", "task_id": "train.wait", "map_index": -1},
    )
    assert isinstance(trigger._positions, LogPositions)
    trigger._positions = positions  # type: ignore[assignment]
    trigger._log = recorder  # type: ignore[assignment]
    return trigger


def _reads(text: str, seed: int) -> list[int]:
    """Random read ends: a stream delivers whatever was printed, splits anywhere."""
    rng = random.Random(seed)
    return [*sorted(rng.sample(range(1, len(text)), 5)), len(text)]


@pytest.mark.parametrize("whole_downloads", [False, True], ids=["stream", "whole-log"])
@pytest.mark.parametrize("seed", range(5))
def test_each_save_comes_after_the_lines_it_covers_and_every_step_saves(whole_downloads: bool, seed: int) -> None:
    text = _log()
    recorder = Recorder()
    positions = MemoryPositions(recorder)
    trigger = _trigger(positions, recorder)
    previous = 0
    for end in _reads(text, seed):
        if whole_downloads:
            trigger._take_logs(text[:end], None)
        else:
            # A stream reopened resends from an earlier point: feed_at reads each character once.
            start = max(0, previous - 7)
            trigger._take_logs(text[start:end], start)
        previous = end
    assert [line.removeprefix("[ray job] ") for line in recorder.lines] == _lines_of(text)
    # At every save, the task log held exactly the lines of the log up to the saved offset: no more (a kill after
    # the save repeats nothing), no fewer (a resumed trigger skips nothing unlogged).
    for offset, step, lines, logged in positions.history:
        assert lines == logged == len(_lines_of(text[:offset])), (offset, step)
    # Every step's results got a save of their own, before the next step's header was logged.
    rewarded = {step for offset, step, _, _ in positions.history if f"Avg Reward: {step / 10:.4f}" in text[:offset]}
    assert rewarded == set(range(1, STEPS + 1)), positions.history


@pytest.mark.parametrize("died_after_step", [1, 3, 5])
def test_a_restarted_trigger_logs_only_what_the_one_before_had_not(died_after_step: int) -> None:
    text = _log()
    first_log, second_log = Recorder(), Recorder()
    positions = MemoryPositions(first_log)
    first = _trigger(positions, first_log)
    # The first trigger read up to the middle of the next step, then died.
    cut = text.index(f"Step {died_after_step + 1}/") + 12
    first._take_logs(text[:cut], 0)
    offset, step = positions.saved[JOB]
    assert step == died_after_step + 1 or step == died_after_step
    second = _trigger(positions, second_log)
    second._logged_until = positions.load(JOB)
    second._take_logs(text, None)  # a new trigger reads the whole log
    both = [line.removeprefix("[ray job] ") for line in first_log.lines[: len(_lines_of(text[:offset]))]]
    both += [line.removeprefix("[ray job] ") for line in second_log.lines]
    assert both == _lines_of(text)
    # ... and its metrics and guards saw every step (it read what it did not log).
    assert len(second.follower.metrics.steps) == STEPS


def test_a_kill_between_a_steps_lines_and_its_save_repeats_that_step_only() -> None:
    text = _log()
    first_log, second_log = Recorder(), Recorder()
    positions = MemoryPositions(first_log)
    first = _trigger(positions, first_log)

    class Killed(Exception):
        pass

    real_save = positions.save

    def save_until_step_four(submission_id: str, offset: int, step: int, lines: int) -> None:
        if step >= 4 and "Avg Reward: 0.4000" in text[:offset]:
            raise Killed  # SIGKILL after step 4's lines reached the task log, before their save
        real_save(submission_id, offset, step, lines)

    positions.save = save_until_step_four  # type: ignore[method-assign]
    with pytest.raises(Killed):
        first._take_logs(text, 0)
    positions.save = real_save  # type: ignore[method-assign]
    second = _trigger(positions, second_log)
    second._logged_until = positions.load(JOB)
    second._take_logs(text, None)
    rewards = [line for r in (first_log, second_log) for line in r.lines if "Avg Reward" in line]
    # Step 4's reward line is there twice (the one step in flight), every other step's once, none missing.
    assert [line.rsplit(" ", 1)[1] for line in rewards] == [f"{k / 10:.4f}" for k in (1, 2, 3, 4, 4, 5, 6)]
