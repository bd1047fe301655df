"""The Ray log archive's bounding and index (run/ray_logs.py) and its copy loop (ray/log_archive.copy_logs) with
scripted Ray answers: tails kept at the per-file cap, the total cap, the time budget, what goes first, names that
are refused, errors recorded and never raised, secrets blanked, and the words the alert and the view use."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from nemo_rl_gke.ray.log_archive import StateApiError, copy_logs, mask_secrets
from nemo_rl_gke.run.ray_logs import (
    ArchiveIndex,
    LogCaps,
    RayNode,
    TailBuffer,
    copy_order,
    describe,
    keep_last_lines,
    list_log_names,
    not_copied,
    safe_log_name,
    summarize,
    summary_of,
)

HEAD = RayNode("a" * 56, "10.0.0.1", True, "ALIVE")
WORKER = RayNode("b" * 56, "10.0.0.2", False, "ALIVE")
DEAD = RayNode("c" * 56, "10.0.0.3", False, "DEAD")


def _lines(n: int, width: int = 10) -> bytes:
    return b"".join(f"{k:0{width - 1}d}\n".encode() for k in range(n))


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_the_tail_buffer_keeps_the_last_cap_bytes_from_a_line_start(chunk: int) -> None:
    data = _lines(1000)  # 10 000 bytes, 10 a line
    buffer = TailBuffer(cap=95)
    for k in range(0, len(data), chunk):
        buffer.add(data[k : k + chunk])
    tail, dropped = buffer.tail()
    # 95 bytes end inside a line: the partial first line goes too, so 9 whole lines are kept.
    assert tail == data[-90:] and dropped == len(data) - 90
    assert buffer.received == len(data)


def test_a_file_under_the_cap_is_whole_and_not_cut() -> None:
    buffer = TailBuffer(cap=100)
    buffer.add(_lines(10))
    assert buffer.tail() == (_lines(10), 0)
    one_line = TailBuffer(cap=5)
    one_line.add(b"x" * 20)  # one long line: its tail, since there is no line start to go to
    assert one_line.tail() == (b"x" * 5, 15)


def test_the_line_limit_keeps_the_last_lines_and_says_when_there_were_more() -> None:
    assert keep_last_lines(b"a\nb\nc\n", 3) == (b"a\nb\nc\n", False)
    assert keep_last_lines(b"a\nb\nc\nd", 3) == (b"b\nc\nd", True)  # a last line without its newline counts
    assert keep_last_lines(b"", 3) == (b"", False)


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("raylet.out", "raylet.out"),
        ("events/event_RAYLET.log", "events/event_RAYLET.log"),
        ("./gcs_server.err", "gcs_server.err"),
        ("old/", None),  # a directory
        ("../../etc/passwd", None),
        ("/etc/passwd", None),
        ("a/../../b", None),
        ("bad\nname", None),
        ("", None),
    ],
)
def test_log_names_from_the_cluster_are_checked_before_they_become_object_names(name: str, safe: str | None) -> None:
    assert safe_log_name(name) == safe


def test_the_listing_is_flattened_once_and_the_most_telling_files_come_first() -> None:
    listing = {"raylet": ["raylet.out", "raylet.err"], "internal": ["old/", "debug_state.txt", "raylet.out"]}
    assert list_log_names(listing) == ["raylet.out", "raylet.err", "debug_state.txt"]
    files = [
        (WORKER, "worker-1.out"),
        (HEAD, "dashboard.log"),
        (WORKER, "raylet.out"),
        (HEAD, "raylet.out"),
        (WORKER, "worker-1.err"),
        (HEAD, "job-driver-nemo-rl-x.log"),
        (HEAD, "gcs_server.out"),
    ]
    ordered = [(n.folder, f) for n, f in copy_order(files)]
    assert ordered == [
        ("head", "job-driver-nemo-rl-x.log"),
        (WORKER.folder, "worker-1.err"),
        ("head", "raylet.out"),
        (WORKER.folder, "raylet.out"),
        ("head", "gcs_server.out"),
        ("head", "dashboard.log"),
        (WORKER.folder, "worker-1.out"),
    ]
    assert WORKER.folder == "worker-bbbbbbbbbbbb"


class ScriptedRay:
    """Ray's State API answers for a copy: nodes, their files and contents, and failures on cue."""

    def __init__(self, files: dict[RayNode, dict[str, bytes]], fail: frozenset[str] = frozenset()) -> None:
        self.files, self.fail = files, fail

    def nodes(self) -> list[RayNode]:
        return [*self.files, DEAD]

    def list_logs(self, node: RayNode) -> list[str]:
        if f"list:{node.folder}" in self.fail:
            raise StateApiError("GET /api/v0/logs: HTTP 500: agent unreachable")
        return list(self.files[node])

    def read_tail(self, node: RayNode, name: str, cap: int, lines: int) -> tuple[bytes, bool, int]:
        if name in self.fail:
            raise StateApiError(f"get_log {name}: HTTP 500: gone")
        buffer = TailBuffer(cap)
        buffer.add(self.files[node][name])
        data, dropped = buffer.tail()
        data, more = keep_last_lines(data, lines)
        return data, bool(dropped) or more, dropped


class MemoryBucket:
    """What a bucket received, by object name."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put(self, name: str, data: bytes, content_type: str, metadata: dict[str, str] | None = None) -> str:
        self.objects["p/" + name] = data
        return "p/" + name


def _copy(ray: ScriptedRay, caps: LogCaps, **kwargs: Any) -> tuple[ArchiveIndex, MemoryBucket]:
    index, bucket = ArchiveIndex("gs://b/p/", caps), MemoryBucket()
    copy_logs(ray, bucket, index, **kwargs)  # type: ignore[arg-type]
    return index, bucket


def test_each_file_keeps_its_tail_and_the_total_cap_stops_the_copy() -> None:
    ray = ScriptedRay(
        {
            HEAD: {"job-driver-j.log": _lines(50), "raylet.out": _lines(5), "dashboard.log": _lines(5)},
            WORKER: {"worker-1.err": _lines(3), "raylet.out": _lines(5)},
        }
    )
    index, bucket = _copy(ray, LogCaps(per_file_bytes=200, total_bytes=300, tail_lines=1000))
    rows = {(f.node, f.file): f for f in index.files}
    driver = rows[("head", "job-driver-j.log")]
    assert driver.truncated and driver.bytes == 200 and driver.dropped_bytes == 300
    assert bucket.objects["p/head/job-driver-j.log"] == _lines(50)[-200:]
    # 100 bytes were left: the worker's stderr (30) whole, the head's raylet (50) whole, the worker's raylet cut to 20.
    assert not rows[(WORKER.folder, "worker-1.err")].truncated
    assert rows[(WORKER.folder, "raylet.out")].truncated and rows[(WORKER.folder, "raylet.out")].bytes == 20
    assert rows[("head", "dashboard.log")].skipped == "total cap reached" and not rows[("head", "dashboard.log")].object
    assert index.total_bytes == 300 == sum(len(v) for v in bucket.objects.values())
    summary = index.summary()
    assert summary == {
        "uri": "gs://b/p/",
        "index": "gs://b/p/index.json",
        "nodes": 3,
        "files": 4,
        "bytes": 300,
        "truncated": 2,
        "skipped": 1,
        "errors": 0,
        "error": "",
    }
    # The dead worker is in the index, with why it has no files.
    dead = next(n for n in index.to_dict()["nodes"] if n["node_id"] == DEAD.node_id)
    assert "DEAD" in dead["error"]


def test_a_line_limit_cuts_too_and_is_recorded() -> None:
    ray = ScriptedRay({HEAD: {"raylet.out": _lines(20)}, WORKER: {}})
    index, bucket = _copy(ray, LogCaps(per_file_bytes=10_000, total_bytes=10_000, tail_lines=5))
    (row,) = index.files
    assert row.truncated and bucket.objects["p/head/raylet.out"] == _lines(20)[-50:]


def test_errors_are_recorded_never_raised_and_the_rest_is_still_copied() -> None:
    ray = ScriptedRay(
        {HEAD: {"raylet.out": b"ok\n", "gcs_server.out": b"x\n"}, WORKER: {"raylet.out": b"w\n"}},
        fail=frozenset({"gcs_server.out", f"list:{WORKER.folder}"}),
    )
    index, bucket = _copy(ray, LogCaps())
    rows = {(f.node, f.file): f for f in index.files}
    assert rows[("head", "gcs_server.out")].error == "get_log gcs_server.out: HTTP 500: gone"
    assert set(bucket.objects) == {"p/head/raylet.out"}
    worker = next(n for n in index.nodes if n["folder"] == WORKER.folder)
    assert worker["error"].startswith("list_logs failed: GET /api/v0/logs: HTTP 500")
    summary = index.summary()
    assert summary["errors"] == 1 and summary["error"] == "head/gcs_server.out: get_log gcs_server.out: HTTP 500: gone"


def test_the_time_budget_skips_what_is_left() -> None:
    ray = ScriptedRay({HEAD: {"raylet.out": b"a\n", "gcs_server.out": b"b\n"}, WORKER: {}})
    ticks = itertools.count(0, 60)  # each look at the clock is a minute later
    index, _ = _copy(ray, LogCaps(deadline_s=90), clock=lambda: float(next(ticks)))
    assert [bool(f.object) for f in index.files] == [True, False]
    assert index.files[1].skipped == "time budget of 90 s spent"


def test_secrets_are_blanked_in_what_is_written() -> None:
    ray = ScriptedRay({HEAD: {"raylet.out": b"env HF_TOKEN=hf_abcdef123 and key wandb-key-xyz\n"}, WORKER: {}})
    _, bucket = _copy(ray, LogCaps(), secrets=["hf_abcdef123", "wandb-key-xyz", "ab"])
    assert bucket.objects["p/head/raylet.out"] == b"env HF_TOKEN=*** and key ***\n"
    # Too short to mean anything: not blanked (it would hide every "ab" in the logs).
    assert mask_secrets(b"abc", ["ab"]) == b"abc"


def test_the_summary_in_words_and_from_teardown_s_result() -> None:
    summary = summarize(
        {
            "uri": "gs://b/p/",
            "nodes": [{}, {}],
            "files": [
                {"object": "p/head/a", "bytes": 3 * 2**20, "truncated": True},
                {"object": "", "skipped": "total cap reached"},
                {"object": "", "node": "head", "file": "b", "error": "HTTP 500"},
            ],
        }
    )
    assert describe(summary) == (
        "gs://b/p/ (1 file(s), 3.0 MiB, 1 cut to their tail, 1 skipped at the cap, 1 error(s): head/b: HTTP 500)"
    )
    assert describe(not_copied("gs://b/p/", "no RayCluster default/rc to copy from")) == (
        "not copied (no RayCluster default/rc to copy from)"
    )
    assert summary_of({"action": "deleted", "ray_logs": summary}) == summary
    assert summary_of({"action": "kept-by-policy"}) is None and summary_of(None) is None
