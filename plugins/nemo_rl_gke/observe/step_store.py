"""The job's step metrics as Airflow keeps them while it trains: a compact, chunked table in ``train.wait``'s XCom.

The trigger parses each driver-log line once. At every step boundary (just before a step's header, where no
parser state is open) it saves what it has: the rows of the steps since its last save, in chunks of
:data:`CHUNK_ROWS` positional rows (the fields of :class:`~nemo_rl_gke.observe.metrics.StepMetrics` in order), then
one head per attempt of the job, which commits them: how many rows there are, where in the driver log they end, the
run-level state (epoch, checkpoints, setup, W&B URL) and the last display lines. Only the chunk holding the newest
rows is ever rewritten, so a save costs the same at step 10,000 as at step 10.

Two readers use it: a restarted trigger rebuilds its metrics from it and reads the driver log on from the head's
offset, instead of parsing the whole log again; the Training view reads the heads and only the chunks it has not
cached, instead of the task log. The store is at most one step behind the log (a step's rows are saved when the next
step's header arrives, and the last ones when the job ends).

Pure and stdlib-only: the trigger and the view do the XCom calls.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics

# Rows per chunk: a NeMo RL step is ~400 bytes here, so a chunk stays ~40 KB, and a save rewrites at most one.
CHUNK_ROWS = 100
HEAD_PREFIX = "metrics_head."
CHUNK_PREFIX = "metrics_rows."
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepMetrics))
# The display lines a head keeps: what the trigger's event needs (its tail) after a restart.
TAIL_LINES = 30
# A recovery's resubmission is the first submission's id plus "-r<attempt>" (observe/recoveries.attempt_id).
_ATTEMPT_RE = re.compile(r"-r(\d+)\Z")
# JSON (and Postgres's JSONB) has no NaN or infinity: they are kept as these strings.
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def head_key(attempt: int) -> str:
    """The XCom key of one attempt's head."""
    return f"{HEAD_PREFIX}{attempt}"


def chunk_key(attempt: int, index: int) -> str:
    """The XCom key of one attempt's chunk ``index`` (rows ``index * CHUNK_ROWS`` on)."""
    return f"{CHUNK_PREFIX}{attempt}.{index}"


def attempt_of(submission_id: str) -> int:
    """The attempt a submission id belongs to (0: the first submission; a recovery's ends in ``-r<n>``)."""
    m = _ATTEMPT_RE.search(submission_id)
    return int(m.group(1)) if m else 0


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


def encode_step(step: StepMetrics) -> list[Any]:
    """One step as a positional row (:data:`FIELDS` order), floats as NeMo RL printed them (12 significant digits)."""
    data = step.to_dict()
    return [_encode(data[name]) for name in FIELDS]


def decode_step(row: Sequence[Any]) -> StepMetrics:
    """A row back to its step (a row from a newer version may carry more fields: they are ignored)."""
    return StepMetrics(**{name: _decode(value) for name, value in zip(FIELDS, row, strict=False)})


def snapshot(
    metrics: RunMetrics,
    *,
    submission_id: str,
    offset: int,
    lines: int,
    tail: Sequence[str],
    saved_rows: int,
    extra: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, list[list[Any]]]]:
    """The head and the chunks to write after ``saved_rows`` rows were saved before: the chunk that held the last
    saved row (its step may have changed since: a re-printed header) and every one after it. Write the chunks first:
    the head commits them."""
    attempt = attempt_of(submission_id)
    total = len(metrics.steps)
    first = max(0, min(saved_rows, total) - 1) // CHUNK_ROWS
    chunks = {}
    for index in range(first, math.ceil(total / CHUNK_ROWS)):
        rows = metrics.steps[index * CHUNK_ROWS : (index + 1) * CHUNK_ROWS]
        chunks[chunk_key(attempt, index)] = [encode_step(s) for s in rows]
    state = metrics.run_state()
    head = {
        "submission_id": submission_id,
        "attempt": attempt,
        "offset": offset,
        "lines": lines,
        "rows": total,
        "chunks": math.ceil(total / CHUNK_ROWS),
        "chunk_rows": CHUNK_ROWS,
        "state": _encode(state),
        "tail": list(tail)[-TAIL_LINES:],
        **dict(extra or {}),
    }
    return head, chunks


def chunk_keys(head: Mapping[str, Any]) -> list[str]:
    """Every chunk key a head commits, oldest first."""
    attempt = int(head.get("attempt") or 0)
    return [chunk_key(attempt, i) for i in range(int(head.get("chunks") or 0))]


def valid_head(value: Any) -> bool:
    """Whether an XCom value is a head this version can read."""
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("submission_id"), str)
        and all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool) for k in ("offset", "rows"))
        and value.get("chunk_rows") == CHUNK_ROWS
    )


def restore(head: Mapping[str, Any], chunks: Sequence[Any]) -> RunMetrics | None:
    """The metrics a head commits, from its chunks in order; None when a chunk is missing or short (a save that did
    not finish: read the log instead)."""
    if not valid_head(head):
        return None
    steps: list[StepMetrics] = []
    for chunk in chunks:
        decoded = decode_chunk(chunk)
        if decoded is None:
            return None
        steps += decoded
    if len(steps) < head["rows"]:
        return None
    return from_steps(head, steps)


def decode_chunk(chunk: Any) -> list[StepMetrics] | None:
    """One chunk's steps (None: not a chunk)."""
    if not isinstance(chunk, list):
        return None
    try:
        return [decode_step(row) for row in chunk]
    except (TypeError, ValueError):
        return None


def from_steps(head: Mapping[str, Any], steps: Sequence[StepMetrics]) -> RunMetrics:
    """The metrics of a head whose chunks were decoded already (the view caches them): its run-level state with
    ``steps`` (the head's count of them)."""
    state = _decode(head.get("state") or {})
    metrics = RunMetrics.from_dict({**state, "steps": []})
    metrics.steps = list(steps[: int(head.get("rows") or 0)])
    return metrics
