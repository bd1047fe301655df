"""The restricted unpickler for DCP ``.metadata``: only the metadata classes and torch dtypes, nothing imported
that a pickle asks for."""

from __future__ import annotations

import importlib
import io
import pickle
import pickletools
from collections.abc import Mapping
from typing import Any, BinaryIO

from .values import clip

# The only globals a DCP .metadata pickle may name, as (module, name). Recorded with a find_class hook on torch
# 2.13 dcp.save outputs (bf16/fp32/fp16/int64/bool tensors, AdamW state, Python values, FSDP2 DTensor saves under
# gloo with 1 and 4 ranks; FACTS §17). Every torch dtype is allowed too (see dcp_globals). Constructing any of
# these runs no code that touches anything outside the object.
DCP_PICKLE_GLOBALS = (
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
)
# Python 3.13 pickles PosixPath as pathlib._local.PosixPath (CPython gh-133789); read it as pathlib.PosixPath.
_GLOBAL_ALIASES = {("pathlib._local", "PosixPath"): ("pathlib", "PosixPath")}
# Pickle opcodes a DCP .metadata never holds, refused before unpickling: they reach outside the pickle.
REFUSED_OPCODES = {
    "PERSID": "a persistent id (an object the loader is asked to fetch from elsewhere)",
    "BINPERSID": "a persistent id (an object the loader is asked to fetch from elsewhere)",
    "EXT1": "a copyreg extension code (a global named by number)",
    "EXT2": "a copyreg extension code (a global named by number)",
    "EXT4": "a copyreg extension code (a global named by number)",
    "NEXT_BUFFER": "an out-of-band buffer",
    "READONLY_BUFFER": "an out-of-band buffer",
}


class RefusedPickleError(pickle.UnpicklingError):
    """A .metadata pickle asked for a global or an opcode that DCP metadata never holds; nothing was imported."""


class DcpMetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` resolving only :data:`DCP_PICKLE_GLOBALS` and torch dtypes.

    ``allowed`` maps ``(module, name)`` to the objects, resolved beforehand from trusted modules: ``find_class``
    only looks names up there, so a name the pickle asks for is never imported. Use :func:`load_dcp_metadata`,
    which also refuses the opcodes in :data:`REFUSED_OPCODES` and checks every length before unpickling.
    """

    def __init__(self, file: BinaryIO, allowed: Mapping[tuple[str, str], Any]) -> None:
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        """The allowed object, or :class:`RefusedPickleError` naming what was asked for."""
        found = self._allowed.get((module, name))
        if found is None:
            raise RefusedPickleError(f"{clip(module)}.{clip(name)}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        """Persistent ids are refused (the pre-scan refuses them first; this is the backstop)."""
        raise RefusedPickleError(REFUSED_OPCODES["PERSID"])


def load_dcp_metadata(data: bytes) -> Any:
    """Unpickle DCP ``.metadata`` bytes with :class:`DcpMetadataUnpickler`; raises on anything but metadata.

    Raises :class:`RefusedPickleError` for a global outside the allowlist or a refused opcode, ImportError when
    torch.distributed.checkpoint is missing, and other exceptions for bytes that are not a whole pickle.
    """
    # pickletools reads every length-prefixed argument with a bounded read, so a crafted length (C pickle allocates
    # it before reading) fails here, and refused opcodes are named before any object exists.
    for opcode, _arg, pos in pickletools.genops(io.BytesIO(data)):
        if opcode.name in REFUSED_OPCODES:
            raise RefusedPickleError(f"{REFUSED_OPCODES[opcode.name]} (opcode {opcode.name} at byte {pos})")
    return DcpMetadataUnpickler(io.BytesIO(data), dcp_globals()).load()


_DCP_GLOBALS: dict[tuple[str, str], Any] = {}


def dcp_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for every allowed global; imports torch (trusted) on first use."""
    if not _DCP_GLOBALS:
        import torch

        found = {(module, name): getattr(importlib.import_module(module), name) for module, name in DCP_PICKLE_GLOBALS}
        found.update({alias: found[target] for alias, target in _GLOBAL_ALIASES.items()})
        # vars(), not getattr: torch's module __getattr__ would import submodules for unknown names.
        found.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
        _DCP_GLOBALS.update(found)
    return _DCP_GLOBALS
