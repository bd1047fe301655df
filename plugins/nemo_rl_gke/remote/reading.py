"""Reading inside the checkpoint directory only: bounded, component by component, never through a symlink out."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from . import limits
from .limits import BLOCK, DIR_FLAGS, FILE_FLAGS, MAX_LISTED, MAX_WALKED
from .report import Problem, Report
from .values import clip, one_line


class CheckpointReader:
    """Reads files under one checkpoint directory and records why a file could not be read as a problem."""

    def __init__(self, root: Path, report: Report) -> None:
        self.root = root
        self.report = report
        # Set in run(): the root with its own symlinks resolved (the caller's choice) and a descriptor on it, from
        # which every file is opened one component at a time.
        self.real_root = root
        self.root_fd = -1
        self.refused: set[Path] = set()  # symlinks already reported, so each is reported once
        self.oversized: set[Path] = set()  # files already reported as over their limit, so not hashed either

    def problem(self, check: str, path: Path | str, reason: str) -> None:
        """Record a problem; paths are shown relative to the checkpoint directory."""
        shown = path.relative_to(self.root).as_posix() if isinstance(path, Path) else path
        self.report.problems.append(Problem(check, shown or ".", reason))

    def capped(self, check: str, path: Path, reasons: list[str], what: str) -> None:
        """Record up to MAX_LISTED problems of one kind, then one summarising the rest."""
        for reason in reasons[:MAX_LISTED]:
            self.problem(check, path, reason)
        if len(reasons) > MAX_LISTED:
            self.problem(check, path, f"and {len(reasons) - MAX_LISTED} more {what}")

    def capped_each(self, check: str, where: Path, found: list[tuple[Path, str]], total: int, what: str) -> None:
        """Record up to MAX_LISTED (path, reason) problems, then one at where counting the rest of total."""
        for path, reason in found[:MAX_LISTED]:
            self.problem(check, path, reason)
        if total > MAX_LISTED:
            self.problem(check, where, f"and {total - MAX_LISTED} more {what}")

    # --- reaching files inside the checkpoint directory only ------------------------------------------------------

    def inside(self, path: Path) -> Path | None:
        """path with its symlinks resolved, or None (recorded) when a symlink on the way leaves the checkpoint dir.

        Symlinks that stay inside are followed: only where a path leads matters, and it must stay under the root.
        """
        here = self.root
        for part in path.relative_to(self.root).parts:
            here = here / part
            if not is_symlink(here):
                continue
            try:
                target = here.resolve()
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
                self.refuse_link(here, "is a symbolic link that loops")
                return None
            if not target.is_relative_to(self.real_root):
                self.refuse_link(here, f"is a symbolic link to {clip(str(target))}, outside the checkpoint directory")
                return None
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            self.refuse_link(path, "cannot be resolved (a symbolic link loop)")
            return None
        if not real.is_relative_to(self.real_root):  # a link swapped in since the walk above
            self.refuse_link(path, "leads outside the checkpoint directory through a symbolic link")
            return None
        return real

    def refuse_link(self, link: Path, reason: str) -> None:
        """Report a symlink once: nothing behind it is read, sized or hashed."""
        if link not in self.refused:
            self.refused.add(link)
            self.problem("symlink", link, f"{link.name} {reason}: refused, nothing is read through it")

    def open_inside(self, real: Path) -> int:
        """A descriptor on real (a resolved path under the root), opened component by component from the root.

        No component may be a symlink (O_NOFOLLOW), so a link swapped in after :meth:`inside` cannot lead out.
        """
        parts = real.relative_to(self.real_root).parts
        fd = os.open(".", DIR_FLAGS, dir_fd=self.root_fd)
        try:
            for part in parts[:-1]:
                inner = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
            return os.open(parts[-1], FILE_FLAGS, dir_fd=fd) if parts else os.dup(fd)
        finally:
            os.close(fd)

    def open_file(self, check: str, path: Path, what: str, limit: int) -> BinaryIO | None:
        """A regular file under the root, opened no larger than limit bytes; None after recording why not."""
        real = self.inside(path)
        if real is None:
            return None
        try:
            handle = open(self.open_inside(real), "rb")  # noqa: SIM115 (returned to the caller, who closes it)
        except FileNotFoundError:
            self.problem(check, path, f"{path.name} is missing ({what})")
            return None
        except OSError as exc:
            self.problem(check, path, f"{path.name} cannot be read: {one_line(exc)}")
            return None
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            handle.close()
            self.problem(check, path, f"{path.name} is not a regular file ({what})")
            return None
        if info.st_size > limit:
            handle.close()
            self.oversized.add(path)
            self.problem(
                check,
                path,
                f"{path.name} is {info.st_size:,} bytes, over the validator's limit of {limit:,} bytes for {what}: "
                "not read",
            )
            return None
        return handle

    def read_bounded(self, check: str, path: Path, what: str, limit: int) -> bytes | None:
        """The whole content of a file of at most limit bytes, or None after recording why not."""
        handle = self.open_file(check, path, what, limit)
        if handle is None:
            return None
        with handle:
            data = handle.read(limit + 1)
        if len(data) > limit:  # it grew after fstat
            self.oversized.add(path)
            self.problem(check, path, f"{path.name} grew past the validator's limit of {limit:,} bytes for {what}")
            return None
        return data

    def read_text(self, check: str, path: Path, what: str, limit: int) -> str | None:
        """A small UTF-8 text file's content, or None after recording why it could not be read."""
        data = self.read_bounded(check, path, what, limit)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem(check, path, f"{path.name} cannot be read: {one_line(exc)}")
            return None

    def list_dir(self, check: str, directory: Path) -> list[Path] | None:
        """The entries of a directory under the root (at most MAX_DIR_ENTRIES), sorted; None when unreadable."""
        real = self.inside(directory)
        if real is None:
            return None
        names: list[str] = []
        try:
            with os.scandir(real) as entries:
                for entry in entries:
                    if len(names) == limits.MAX_DIR_ENTRIES:
                        self.problem(
                            check,
                            directory,
                            f"{directory.name} holds more than {limits.MAX_DIR_ENTRIES:,} entries: not read further",
                        )
                        break
                    names.append(entry.name)
        except OSError as exc:
            self.problem(check, directory, f"{directory.name} cannot be listed: {one_line(exc)}")
            return None
        return [directory / name for name in sorted(names)]

    def walk_files(self, check: str, top: Path) -> list[Path]:
        """Regular files under top (symlinks inside the root included, symlinked directories not descended)."""
        found: list[Path] = []
        pending = [top]
        walked = 0
        while pending:
            for path in self.list_dir(check, pending.pop()) or ():
                walked += 1
                if walked > MAX_WALKED:
                    self.problem(check, top, f"{top.name} holds more than {MAX_WALKED:,} files and directories")
                    return sorted(found)
                real = self.inside(path)
                if real is None:
                    continue
                if real.is_dir() and not is_symlink(path):
                    pending.append(path)
                elif real.is_file():
                    found.append(path)
        return sorted(found)

    def size_of(self, path: Path) -> int | None:
        """A file's size when it is reached inside the root; None when refused or missing."""
        real = self.inside(path)
        if real is None:
            return None
        try:
            return real.stat().st_size
        except OSError:
            return None


def is_symlink(path: Path) -> bool:
    try:
        return path.is_symlink()
    except OSError:
        return False


def sha256_of(handle: BinaryIO, limit: int) -> tuple[int, str]:
    """(bytes read, sha256) of an open file, read in 1 MiB blocks and never past limit + 1 bytes."""
    digest = hashlib.sha256()
    size = 0
    while size <= limit:
        block = handle.read(min(BLOCK, limit + 1 - size))
        if not block:
            break
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()
