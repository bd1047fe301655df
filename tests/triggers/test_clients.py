"""Trigger client modules imported off the event loop: every trigger gets the whole module, also the ones that ask
while another trigger's thread is still importing it (13 network triggers start at once in a run)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from nemo_rl_gke.triggers.clients import client_module


def test_triggers_asking_at_once_all_get_the_module_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A module whose import takes a while, and whose class exists only at its end (as a hook module's does).
    (tmp_path / "slow_client_module.py").write_text("import time\ntime.sleep(0.5)\nclass Hook:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_client_module", raising=False)

    async def ask() -> bool:
        module = await client_module("slow_client_module")
        return hasattr(module, "Hook")  # what the trigger uses at once

    async def many() -> list[bool]:
        first = asyncio.ensure_future(ask())
        await asyncio.sleep(0.1)  # the first thread is inside the module's body now
        rest = await asyncio.gather(*(ask() for _ in range(12)))
        return [await first, *rest]

    assert asyncio.run(many()) == [True] * 13
