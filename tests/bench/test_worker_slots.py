"""bench/worker_slots.py: its log arithmetic on made-up logs. Its reading of real logs runs on the browser tests' run
(tests/browser/test_ui.py), whose real scheduler and triggerer are the stack the bench starts, so it cannot rot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import worker_slots
from nemo_rl_gke.run import topology


def _write(path: Path, lines: list[tuple[float, str]]) -> None:
    stamp = "2026-12-01T10:00:{:06.3f}Z"
    path.write_text("\n".join(json.dumps({"timestamp": stamp.format(at), "event": event}) for at, event in lines))


def test_a_deferred_task_holds_its_slot_only_until_it_has_deferred(tmp_path: Path) -> None:
    task_dir = tmp_path / f"task_id={topology.GKE_CLUSTER}"
    task_dir.mkdir()
    attempt = task_dir / "attempt=1.log"
    _write(attempt, [(1.0, "::group::Pre Execute"), (3.0, "Pausing task as DEFERRED. "), (3.5, "::endgroup::"),
                     (40.0, "::group::Pre Execute"), (41.0, "::endgroup::")])  # fmt: skip
    _write(task_dir / "attempt=1.log.trigger.7.log", [(4.0, "trigger starting"), (39.0, "Trigger fired event x")])
    (task,) = [worker_slots.read_try(task_dir, attempt)]
    base = task.segments[0][0] - 1.0  # the made-up stamps are seconds into 10:00 UTC
    assert [(a - base, b - base) for a, b in task.segments] == [(1.0, 3.5), (40.0, 41.0)]
    assert [(a - base, b - base) for a, b in task.waits] == [(3.0, 39.0)]
    assert task.running_s == pytest.approx(3.5) and task.slot_in_waits_s == pytest.approx(0.5)
    value, _, _, synchronous = worker_slots.ratio([task])
    assert value == pytest.approx(0.5 / 36) and synchronous == []


def test_a_step_that_waits_on_its_slot_counts_whole(tmp_path: Path) -> None:
    sync = worker_slots.TaskWaits(topology.LUSTRE, segments=[(0.0, 300.0)])
    quick = worker_slots.TaskWaits(topology.DELETE_NET, segments=[(0.0, 2.0)])  # nothing to wait for
    deferred = worker_slots.TaskWaits(topology.NET, segments=[(0.0, 2.0)], waits=[(1.5, 101.5)])
    value, slot, wall, synchronous = worker_slots.ratio([sync, quick, deferred])
    assert synchronous == [topology.LUSTRE]
    assert (slot, wall) == (pytest.approx(300.5), pytest.approx(400.0))
    assert value > worker_slots.TARGET


def test_a_teardown_step_that_kept_its_resource_waited_on_nothing_however_long_it_ran(tmp_path: Path) -> None:
    # Under a keep policy every delete step starts at once; on a busy 2-core machine one may run for 10 s and more.
    task_dir = tmp_path / f"task_id={topology.DELETE_LUSTRE}"
    task_dir.mkdir()
    attempt = task_dir / "attempt=1.log"
    _write(attempt, [(1.0, "::group::Pre Execute"), (13.0, "Kept (kept-by-policy): teardown_policy keeps it"),
                     (14.0, "::endgroup::")])  # fmt: skip
    kept = worker_slots.read_try(task_dir, attempt)
    assert kept.kept and kept.running_s > worker_slots.SYNC_WAIT_MIN_S
    slow = worker_slots.TaskWaits(topology.DELETE_NET, segments=[(0.0, 13.0)])  # deleted, but never deferred
    assert worker_slots.ratio([kept, slow])[3] == [topology.DELETE_NET]
