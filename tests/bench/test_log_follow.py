"""bench/log_follow.py's quick mode against a real local Ray job: the follower's bytes fetched over the log's size."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.paths import ROOT


def test_quick_mode_meets_the_target_and_shows_the_old_way_far_above_it() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/log_follow.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    new = float(re.search(r"tail websocket \(the follower\): ([\d.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    old = float(re.search(r"whole log every poll \(old\): +([\d.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert new <= 1.2
    assert old > 3 * new  # 20 polls of a growing log: the old way fetches it many times over
