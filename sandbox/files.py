"""The sandbox's local stand-ins for storage: a directory per Lustre instance and a directory per GCS bucket.

Layout under the state dir: ``lustre/{project}/{zone}/{instance}/`` (what later issues mount as ``/data``) and
``gcs/{bucket}/{object path}`` (where ``exportData`` writes). Every path a client names is resolved inside its root,
so ``..`` cannot escape it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

LUSTRE_DIR = "lustre"
GCS_DIR = "gcs"
GCS_META_DIR = "gcs-meta"  # objects' custom metadata, beside their bytes (sandbox.apis.storage)


class PathEscapeError(ValueError):
    """A client-supplied path resolves outside the directory it must stay in."""


def lustre_dir(state_dir: Path, project: str, zone: str, instance: str) -> Path:
    """The local data directory of a Lustre instance."""
    return state_dir / LUSTRE_DIR / project / zone / instance


def gcs_root(state_dir: Path) -> Path:
    """The directory that holds one subdirectory per bucket."""
    return state_dir / GCS_DIR


def gcs_meta_root(state_dir: Path) -> Path:
    """The directory that holds the objects' metadata, one subdirectory per bucket."""
    return state_dir / GCS_META_DIR


def inside(root: Path, relative: str) -> Path:
    """``root/relative``, refused when it resolves outside ``root``."""
    root = root.resolve()
    path = (root / relative.lstrip("/")).resolve()
    if path != root and root not in path.parents:
        raise PathEscapeError(f"{relative!r} leaves {root}")
    return path


def copy_tree(source: Path, destination: Path) -> int:
    """Copy a file or the contents of a directory into ``destination``, merging; returns the files copied.

    Raises :class:`FileNotFoundError` when ``source`` does not exist.
    """
    if not source.exists():
        raise FileNotFoundError(str(source))
    destination.mkdir(parents=True, exist_ok=True)
    if source.is_file():
        shutil.copy2(source, destination / source.name)
        return 1
    copied = 0
    for item in source.rglob("*"):
        if item.is_file():
            target = destination / item.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target)
            copied += 1
    return copied


def remove_tree(path: Path) -> None:
    """Delete a directory tree if it exists (a deleted Lustre instance loses its files)."""
    shutil.rmtree(path, ignore_errors=True)
