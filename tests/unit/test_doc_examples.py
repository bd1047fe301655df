"""The docs' console examples of ``python -m nemo_rl_gke validate``, run as written and compared line for line.

docs/security.md shows what the CLI answers a conf from outside the deployment's bounds and a hostile conf. Once,
the hostile example said 7 findings while the same command gave 8: a doc that shows output must be checked against
it. Each example's files are written as the doc gives them (``cat outsider.json``'s output, the JSON block before the
hostile command), each command runs in bash from the repository's root with no Airflow setting of the test
session's, and its output must be the doc's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.paths import ROOT

SECURITY = ROOT / "docs" / "security.md"


def console_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each console block as (command, output lines) pairs; a command's ``\\`` continuations joined."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)\n```", text, re.S):
        pairs: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                pairs.append((line[2:], []))
            elif pairs and pairs[-1][0].endswith("\\") and not pairs[-1][1]:
                pairs[-1] = (pairs[-1][0][:-1].rstrip() + " " + line.strip(), [])
            elif pairs:
                pairs[-1][1].append(line)
        blocks.append(pairs)
    return blocks


def _validate_examples() -> list[tuple[str, list[str]]]:
    text = SECURITY.read_text(encoding="utf-8")
    return [pair for block in console_blocks(text) for pair in block if "nemo_rl_gke validate" in pair[0]]


def _run(command: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONPATH"))}
    done = subprocess.run(
        ["/bin/bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return (done.stdout + done.stderr).splitlines()


def _files(tmp_path: Path) -> None:
    """The conf files the examples read, as the doc gives them."""
    text = SECURITY.read_text(encoding="utf-8")
    outsider = next(out for block in console_blocks(text) for cmd, out in block if cmd.startswith("cat outsider.json"))
    (tmp_path / "outsider.json").write_text("\n".join(outsider), encoding="utf-8")
    hostile = re.search(r"A hostile conf, `(/tmp/secdoc/hostile\.json)`:\n\n```json\n(.*?)\n```", text, re.S)
    assert hostile, "docs/security.md: the hostile conf's JSON block"
    path = Path(hostile.group(1))
    path.parent.mkdir(parents=True, exist_ok=True)
    json.loads(hostile.group(2))
    path.write_text(hostile.group(2), encoding="utf-8")


def test_the_examples_are_found() -> None:
    commands = [
        command for command, _ in _validate_examples() if "--conf outsider.json" in command or "hostile" in command
    ]
    assert len(commands) == 2, commands


@pytest.mark.parametrize("index", [0, 1])
def test_a_validate_example_answers_what_the_doc_shows(index: int, tmp_path: Path) -> None:
    _files(tmp_path)
    runnable = [pair for pair in _validate_examples() if ".venv/bin/python" in pair[0]]
    command, shown = runnable[index]
    assert len(shown) > 2 and shown[-1] == "exit=1", shown
    # Run from the repository's root (PYTHONPATH=plugins, .venv), with outsider.json beside it in a scratch dir.
    command = command.replace("--conf outsider.json", f"--conf {tmp_path / 'outsider.json'}")
    assert _run(command, ROOT) == shown
