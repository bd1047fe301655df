"""The Ray log archive's rules, pure: which session log files are copied first, how each is cut to its cap (its
tail kept), the index of what was copied, and the short summary teardown records for the alert and the Training
view.

Before teardown deletes the RayCluster, :mod:`nemo_rl_gke.ray.log_archive` copies every Ray node's session logs
(``/tmp/ray/session_latest/logs``, read through Ray's own State API log endpoints) to
``gs://<export bucket>/nemo-rl-gke/ray-logs/<dag>/<run>/`` (:meth:`RunSpec.ray_logs_uri`), one folder per node.
Not under the run's export prefix: a later ``resume=latest`` imports that whole prefix into its new Lustre
(:func:`nemo_rl_gke.plan.transfers.import_source`), and the logs have no business there.

Bounded on purpose: a night's raylet or worker log can be gigabytes, teardown holds a worker slot while it copies,
and the failure is nearly always at the end. So each file keeps its last :attr:`LogCaps.per_file_bytes`, the whole
copy stops at :attr:`LogCaps.total_bytes` (the most telling files first, :func:`priority`), and every cut is
written into the index as ``truncated`` with the bytes dropped.

Stdlib only, no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

INDEX_NAME = "index.json"
INDEX_VERSION = 1
HEAD_DIR = "head"
# The XCom field of teardown.delete-raycluster's result that holds the summary (:meth:`ArchiveIndex.summary`).
RESULT_KEY = "ray_logs"
# An error is cut to this many characters in the index and the summary: the task log has the rest.
ERROR_CHARS = 300

# Most telling first: the job's driver, what workers printed to stderr, the raylet (node deaths, OOM kills), the GCS,
# then workers' stdout, the core-worker logs and everything else. Matched on the file name's start.
_PRIORITY: tuple[tuple[str, ...], ...] = (
    ("job-driver-",),
    ("worker-",),  # *.err are ranked before *.out below
    ("raylet.",),
    ("gcs_server.",),
    ("python-core-driver-", "python-core-worker-"),
    ("dashboard", "runtime_env", "log_monitor", "monitor"),
)


@dataclass(frozen=True)
class LogCaps:
    """How much is copied: per file (its tail), in all, the lines Ray is asked for per file (its log agent reads
    them backwards from the file's end, so a huge file is not read whole), and the whole copy's time."""

    per_file_bytes: int = 4 * 1024 * 1024
    total_bytes: int = 64 * 1024 * 1024
    tail_lines: int = 100_000
    deadline_s: float = 240.0


@dataclass(frozen=True)
class RayNode:
    """One Ray node as the State API lists it."""

    node_id: str
    node_ip: str
    is_head: bool
    state: str

    @property
    def folder(self) -> str:
        """The node's folder in the archive: ``head``, or ``worker-<first 12 hex of its node id>`` (workers on one
        host share an IP, never a node id)."""
        return HEAD_DIR if self.is_head else f"worker-{self.node_id[:12]}"

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayNode:
        """A row of ``GET /api/v0/nodes`` (Ray's ``NodeState``)."""
        return cls(
            node_id=str(row.get("node_id") or ""),
            node_ip=str(row.get("node_ip") or ""),
            is_head=bool(row.get("is_head_node")),
            state=str(row.get("state") or ""),
        )


def safe_log_name(name: str) -> str | None:
    """A log file name as ``list_logs`` gave it, if it is one to copy: a relative path inside the log directory, no
    directory entry (those end in ``/``), no ``..``, nothing unprintable. None otherwise. The names come from the
    cluster, and they become object names."""
    if not name or name.endswith("/") or not name.isprintable() or "\\" in name:
        return None
    normal = posixpath.normpath(name)
    if normal.startswith("/") or normal == "." or ".." in normal.split("/"):
        return None
    return normal


def priority(name: str) -> int:
    """Where a log file comes in the copy (lower first): see ``_PRIORITY``; a worker's ``.err`` before its
    ``.out``."""
    base = posixpath.basename(name)
    for rank, starts in enumerate(_PRIORITY):
        if base.startswith(starts):
            if starts == ("worker-",):
                return rank if base.endswith(".err") else rank + len(_PRIORITY)
            return rank
    return 2 * len(_PRIORITY)


def copy_order(files: Iterable[tuple[RayNode, str]]) -> list[tuple[RayNode, str]]:
    """Every (node, file) in copy order: by :func:`priority`, the head's before the workers', then by name."""
    return sorted(files, key=lambda nf: (priority(nf[1]), not nf[0].is_head, nf[0].folder, nf[1]))


def list_log_names(listing: Mapping[str, Any]) -> list[str]:
    """The files of a ``list_logs`` answer (``{category: [file, ...]}``), safe ones only, each once."""
    names: list[str] = []
    for files in listing.values():
        for name in files if isinstance(files, list) else ():
            safe = safe_log_name(str(name))
            if safe is not None and safe not in names:
                names.append(safe)
    return names


@dataclass
class TailBuffer:
    """The last ``cap`` bytes of a stream of chunks, and how many bytes came in all: memory stays bounded whatever
    Ray sends."""

    cap: int
    received: int = 0
    _chunks: list[bytes] = field(default_factory=list)
    _held: int = 0

    def add(self, chunk: bytes) -> None:
        """Take one chunk; drop whole chunks from the front once the rest still holds ``cap`` bytes."""
        if not chunk:
            return
        self.received += len(chunk)
        self._chunks.append(chunk)
        self._held += len(chunk)
        while self._chunks and self._held - len(self._chunks[0]) >= self.cap:
            self._held -= len(self._chunks.pop(0))

    def tail(self) -> tuple[bytes, int]:
        """(the kept tail, the bytes dropped before it): at most ``cap`` bytes, starting at a line's start when a
        line break falls inside what had to be cut off anyway."""
        held = b"".join(self._chunks)
        if self.received <= self.cap:
            return held, 0
        data = held[-self.cap :] if self.cap > 0 else b""
        # A partial first line helps nobody: start after its end, unless the cut fell on a line's start (the byte
        # before it, when still held, is a newline) or the whole tail is one line.
        at_line_start = len(held) > len(data) and held[-len(data) - 1 : -len(data)] == b"\n"
        cut = data.find(b"\n")
        if not at_line_start and 0 <= cut < len(data) - 1:
            data = data[cut + 1 :]
        return data, self.received - len(data)


def keep_last_lines(data: bytes, lines: int) -> tuple[bytes, bool]:
    """``data`` without its lines before the last ``lines`` (a last line without a newline counts); and whether any
    went. Ray is asked for one line more than :attr:`LogCaps.tail_lines`, so a longer answer means a longer file."""
    count = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if count <= lines:
        return data, False
    drop = count - lines
    start = 0
    for _ in range(drop):
        start = data.index(b"\n", start) + 1
    return data[start:], True


@dataclass(frozen=True)
class CopiedFile:
    """One file's row in the index: where it came from, where it went, how much, and what was cut or went wrong."""

    node: str  # the node's folder
    node_id: str
    file: str  # its name in the node's log directory
    object: str = ""  # the object name in the bucket ('' when nothing was written)
    bytes: int = 0
    truncated: bool = False
    dropped_bytes: int = 0  # what the cut left out (lower bound when Ray's line limit cut first)
    skipped: str = ""  # why it was not copied (total cap, time), if so
    error: str = ""  # why copying it failed, if so


@dataclass
class ArchiveIndex:
    """What one copy did: written as ``index.json`` beside the logs, and summarised into teardown's XCom."""

    uri: str  # gs://bucket/prefix/ of the archive
    caps: LogCaps
    started_at: str = ""
    finished_at: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    files: list[CopiedFile] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what failed outside a single file (listing, the index)

    @property
    def total_bytes(self) -> int:
        """Bytes written, in all."""
        return sum(f.bytes for f in self.files)

    def remaining(self) -> int:
        """Bytes the total cap still allows."""
        return max(0, self.caps.total_bytes - self.total_bytes)

    def error(self, message: str) -> None:
        """Record an error of the copy as a whole (cut to :data:`ERROR_CHARS`)."""
        self.errors.append(short_error(message))

    def to_dict(self) -> dict[str, Any]:
        """The index document."""
        return {
            "version": INDEX_VERSION,
            "uri": self.uri,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "caps": asdict(self.caps),
            "total_bytes": self.total_bytes,
            "nodes": self.nodes,
            "files": [asdict(f) for f in self.files],
            "errors": self.errors,
        }

    def summary(self) -> dict[str, Any]:
        """The few figures teardown's XCom, the alert and the Training view carry (no file list)."""
        return summarize(self.to_dict())


def summarize(index: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of an index document (this copy's, or one an earlier try wrote)."""
    files = [f for f in index.get("files") or [] if isinstance(f, Mapping)]
    errors = [str(e) for e in index.get("errors") or []] + [
        f"{f.get('node')}/{f.get('file')}: {f.get('error')}" for f in files if f.get("error")
    ]
    uri = str(index.get("uri") or "")
    return {
        "uri": uri,
        "index": uri + INDEX_NAME if uri else "",
        "nodes": len(index.get("nodes") or []),
        "files": sum(1 for f in files if f.get("object")),
        "bytes": sum(int(f.get("bytes") or 0) for f in files),
        "truncated": sum(1 for f in files if f.get("truncated")),
        "skipped": sum(1 for f in files if f.get("skipped")),
        "errors": len(errors),
        "error": errors[0] if errors else "",
    }


def not_copied(uri: str, why: str) -> dict[str, Any]:
    """The summary of a copy that did not happen (no RayCluster, unreachable, or failed before listing)."""
    return {**summarize({"uri": uri, "errors": [short_error(why)]}), "copied": False}


def short_error(message: Any) -> str:
    """One line of an error, cut to :data:`ERROR_CHARS`."""
    text = " ".join(str(message).split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def describe(summary: Mapping[str, Any] | None) -> str:
    """The summary in a few words for people: where, how many files and MiB, what was cut, what failed."""
    if not summary:
        return ""
    uri = str(summary.get("uri") or "")
    if not summary.get("files"):
        why = str(summary.get("error") or "nothing to copy")
        return f"not copied ({why})" if uri else ""
    parts = [f"{summary['files']} file(s), {int(summary.get('bytes') or 0) / 2**20:.1f} MiB"]
    if summary.get("truncated"):
        parts.append(f"{summary['truncated']} cut to their tail")
    if summary.get("skipped"):
        parts.append(f"{summary['skipped']} skipped at the cap")
    if summary.get("errors"):
        parts.append(f"{summary['errors']} error(s): {summary.get('error')}")
    return f"{uri} ({', '.join(parts)})"


def summary_of(result: Any) -> dict[str, Any] | None:
    """The Ray logs summary in teardown.delete-raycluster's result (its return value XCom), if there is one."""
    found = result.get(RESULT_KEY) if isinstance(result, Mapping) else None
    return dict(found) if isinstance(found, Mapping) else None


def node_rows(nodes: Sequence[RayNode]) -> list[dict[str, Any]]:
    """The index's node list."""
    return [{"folder": n.folder, "node_id": n.node_id, "node_ip": n.node_ip, "state": n.state} for n in nodes]
