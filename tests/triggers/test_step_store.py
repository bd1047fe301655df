"""The step store (observe/step_store.py, triggers/metrics_store.py): the trigger saves its parsed steps at every step
boundary, a chunk at a time; a restarted trigger takes them as they are and parses only the log after them."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from typing import Any

import pytest

from nemo_rl_gke.observe import step_store
from nemo_rl_gke.observe.metrics import LogFollower, RunMetrics, StepMetrics
from nemo_rl_gke.triggers.metrics_store import MetricsStore
from nemo_rl_gke.triggers.rayjob import RayJobTrigger
from tests.triggers.test_log_position import JOB, MemoryPositions, _log
from tests.triggers.test_rayjob_event import Recorder


class MemoryStore:
    """What MetricsStore keeps in the task's XCom, in memory, every value through JSON as XCom stores it."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.writes: list[list[str]] = []  # the keys of each save, in order

    def load(self, submission_id: str) -> tuple[dict[str, Any], RunMetrics] | None:
        head = self.values.get(step_store.head_key(step_store.attempt_of(submission_id)))
        if not step_store.valid_head(head) or head["submission_id"] != submission_id:
            return None
        metrics = step_store.restore(head, [self.values.get(k) for k in step_store.chunk_keys(head)])
        return None if metrics is None else (head, metrics)

    def save(self, head: Mapping[str, Any], chunks: Mapping[str, Any]) -> bool:
        keys = [*chunks, step_store.head_key(head["attempt"])]
        for key, value in [*chunks.items(), (keys[-1], head)]:
            self.values[key] = json.loads(json.dumps(value, allow_nan=False))
        self.writes.append(keys)
        return True


def _trigger(store: MemoryStore, positions: MemoryPositions, recorder: Recorder, job: str = JOB) -> RayJobTrigger:
    trigger = RayJobTrigger(
        address="http://127.0.0.1:1",
        submission_id=job,
        task_key={"dag_id": "d", "run_id": "manual__1", "task_id": "train.wait", "map_index": -1},
    )
    assert isinstance(trigger._store, MetricsStore)
    trigger._store = store  # type: ignore[assignment]
    trigger._positions = positions  # type: ignore[assignment]
    trigger._log = recorder  # type: ignore[assignment]
    return trigger


def _start(trigger: RayJobTrigger) -> None:
    asyncio.run(trigger._start_following())


class ParseCounter:
    """Counts the lines RunMetrics parses (what a restarted trigger must not do for the steps the store has)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lines = 0
        real = RunMetrics._parse_body

        def counted(metrics: RunMetrics, body: str) -> None:
            self.lines += 1
            real(metrics, body)

        monkeypatch.setattr(RunMetrics, "_parse_body", counted)


@pytest.mark.parametrize("died_after_step", [2, 5])
@pytest.mark.parametrize("whole_downloads", [False, True], ids=["stream", "whole-log"])
def test_a_restarted_trigger_parses_only_the_log_after_the_saved_steps(
    died_after_step: int, whole_downloads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _log(8)
    store, positions = MemoryStore(), MemoryPositions()
    first = _trigger(store, positions, Recorder())
    cut = text.index(f"Step {died_after_step + 1}/") + 30  # died in the middle of the next step's lines
    first._take_logs(text[:cut], 0)
    head = store.values[step_store.head_key(0)]
    # The last save was at the boundary before the step that was in flight: every earlier step is in it.
    header = text.rfind("\n", 0, text.index(f"Step {died_after_step + 1}/")) + 1
    assert head["rows"] == died_after_step and head["offset"] == header

    counter = ParseCounter(monkeypatch)
    second_log = Recorder()
    second = _trigger(store, positions, second_log)
    _start(second)
    assert second.follower.offset == head["offset"] and len(second.follower.metrics.steps) == died_after_step
    if whole_downloads:
        second._take_logs(text, None)
    else:
        second._take_logs(text[head["offset"] :], head["offset"])
    second._flush_logs()
    # It parsed the lines after the saved offset only, and ended with what one pass over the whole log gives.
    assert counter.lines == len(LogFollower().feed(text[head["offset"] :]))
    whole = LogFollower()
    whole.feed(text)
    assert second.follower.metrics.to_dict() == whole.metrics.to_dict()
    # Its last save (the log's end) commits every step, and the store gives them back.
    final = store.values[step_store.head_key(0)]
    assert final["rows"] == 8 and final["final"] is True
    assert store.load(JOB)[1].to_dict() == whole.metrics.to_dict()  # type: ignore[index]


def test_each_save_writes_the_newest_chunk_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_store, "CHUNK_ROWS", 4)
    monkeypatch.setattr(step_store, "chunk_key", lambda a, i: f"metrics_rows.{a}.{i}")
    text = _log(11)
    store = MemoryStore()
    trigger = _trigger(store, MemoryPositions(), Recorder())
    trigger._take_logs(text, 0)
    trigger._flush_logs()
    # A save at every boundary (before the headers of steps 2..11) and one at the end; each rewrites at most the
    # chunk that held the last saved row and the one after it.
    assert len(store.writes) == 11
    assert all(len(keys) <= 3 for keys in store.writes), store.writes
    assert sorted(k for k in store.values if k.startswith("metrics_rows.")) == [f"metrics_rows.0.{i}" for i in range(3)]
    assert [s.step for s in store.load(JOB)[1].steps] == list(range(1, 12))  # type: ignore[index]


def test_a_save_cut_between_its_chunks_and_its_head_keeps_the_last_committed_state() -> None:
    text = _log(6)
    store = MemoryStore()
    trigger = _trigger(store, MemoryPositions(), Recorder())
    trigger._take_logs(text[: text.index("Step 4/") + 7], 0)
    committed = store.load(JOB)
    assert committed is not None and len(committed[1].steps) == 3
    # A newer chunk written, its head not (the triggerer died between the two): the old head still reads whole.
    newer = step_store.encode_step(StepMetrics(step=4, total_steps=6, loss=0.5))
    store.values[step_store.chunk_key(0, 0)] = [*store.values[step_store.chunk_key(0, 0)], newer]
    again = store.load(JOB)
    assert again is not None and [s.step for s in again[1].steps] == [1, 2, 3]


def test_rows_keep_every_field_and_non_finite_numbers_through_json() -> None:
    step = StepMetrics(
        step=3,
        total_steps=10,
        epoch=2,
        loss=math.nan,
        avg_reward=0.25,
        kl_error=math.inf,
        phase_times_s={"generation": 1.5},
        group_tokens_per_s={"E2E": -math.inf},
        checkpoint_step=23,
    )
    row = json.loads(json.dumps(step_store.encode_step(step), allow_nan=False))
    back = step_store.decode_step(row)
    assert math.isnan(back.loss) and back.kl_error == math.inf and back.group_tokens_per_s == {"E2E": -math.inf}
    assert (back.step, back.epoch, back.avg_reward, back.phase_times_s, back.checkpoint_step) == (
        3, 2, 0.25, {"generation": 1.5}, 23,
    )  # fmt: skip


def test_a_recovery_attempt_has_its_own_head_and_rows() -> None:
    store = MemoryStore()
    first = _trigger(store, MemoryPositions(), Recorder())
    first._take_logs(_log(4), 0)
    first._flush_logs()
    retry = _trigger(store, MemoryPositions(), Recorder(), job=f"{JOB}-r1")
    retry._take_logs(_log(2), 0)
    retry._flush_logs()
    assert store.values[step_store.head_key(1)]["submission_id"] == f"{JOB}-r1"
    assert (len(store.load(JOB)[1].steps), len(store.load(f"{JOB}-r1")[1].steps)) == (4, 2)  # type: ignore[index]
    assert step_store.attempt_of("nemo-rl-x-abc") == 0 and step_store.attempt_of("nemo-rl-x-abc-r12") == 12
