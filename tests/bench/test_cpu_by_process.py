"""bench/cpu_by_process.py on a command whose child burns a known amount of CPU under a name the table knows."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.paths import ROOT

# The child spins until its own CPU time is 1 s, then stays alive 5 s so a sample sees that total (on a loaded machine
# too). Its command line ends in grpo_cpu.py (the parent's spells it in two halves), so only the child counts as the
# local recipe's training. It runs with an empty environment, as a process that overwrites its own does: its parent
# makes it the command's.
CHILD = "import time\nwhile time.process_time() < 1.0: pass\ntime.sleep(5)\n"
PARENT = (
    "import subprocess, sys\n"
    f"child = subprocess.run([sys.executable, '-c', {CHILD!r}, 'grpo' + '_cpu.py'], env={{}})\n"
    "sys.exit(child.returncode + 3)\n"
)


def test_the_childs_cpu_is_counted_under_its_kind_and_the_exit_code_passes_through() -> None:
    bench = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench/cpu_by_process.py"),
            "--interval",
            "0.1",
            "--",
            sys.executable,
            "-c",
            PARENT,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Another process of the same kind starts on the machine meanwhile: not the command's, so not counted.
    other = subprocess.Popen([sys.executable, "-c", CHILD, "grpo_cpu.py"])
    output, _ = bench.communicate(timeout=120)
    other.wait(timeout=60)
    assert bench.returncode == 3, output
    rows = {
        m.group(3): (float(m.group(1)), int(m.group(2)))
        for m in re.finditer(r"^\s*([\d.]+)\s+[\d.]+%\s+(\d+)\s+(.+)$", output, re.M)
    }
    cpu, processes = rows["local recipe: training"]
    assert processes == 1 and 0.9 <= cpu < 1.5, output
    # The parent is another row, and the total adds every row up.
    assert rows["total"][1] == 2 and abs(rows["total"][0] - sum(v[0] for k, v in rows.items() if k != "total")) < 0.2
    assert re.search(r"^wall [\d.]+ s, [\d.]+ cores busy on average \(of \d+\); exit 3$", output, re.M)
