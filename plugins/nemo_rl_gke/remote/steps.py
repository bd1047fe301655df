"""Every ``step_N`` directory on a Lustre mount, for teardown to compare with the checkpoint records."""

from __future__ import annotations

import os
import re
from pathlib import Path

# How deep and how many directories the step listing walks; past either it says so, and the listing keeps Lustre.
LIST_DEPTH = 8
LIST_LIMIT = 20_000
LIST_TRUNCATED = "<listing truncated>"
_STEP_DIR = re.compile(r"^step_[0-9]+$")


def list_step_dirs(mount: str | Path) -> list[str]:
    """Every ``step_N`` directory on a Lustre mount, as paths on the filesystem (``/dir/step_N``), sorted.

    Teardown compares them with the checkpoint records before it deletes the instance. A ``step_N`` directory is not
    entered, symbolic links are not followed; past :data:`LIST_DEPTH` levels or :data:`LIST_LIMIT` directories the
    list ends with :data:`LIST_TRUNCATED`, which no record accounts for (so Lustre is kept, not guessed about).
    """
    root = Path(mount)
    found: list[str] = []
    todo = [(root, 0)]
    seen = 0
    while todo:
        directory, depth = todo.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            seen += 1
            if seen > LIST_LIMIT:
                return [*sorted(found), LIST_TRUNCATED]
            path = "/" + Path(entry.path).relative_to(root).as_posix()
            if _STEP_DIR.match(entry.name):
                found.append(path)
            elif depth + 1 < LIST_DEPTH:
                todo.append((Path(entry.path), depth + 1))
            else:
                return [*sorted(found), LIST_TRUNCATED]
    return sorted(found)
