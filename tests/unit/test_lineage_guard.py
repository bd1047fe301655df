"""The job's first lines: it trains only when checkpoint_dir holds exactly the step ``resume`` starts from (NeMo RL
resumes from the highest ``step_N`` there, whoever wrote it). Run with bash on a directory standing for /data, as the
sandbox's Ray runs the job."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nemo_rl_gke.plan.ray_job import LINEAGE_EXIT, lineage_guard
from nemo_rl_gke.run.spec import RunSpec

SPEC = RunSpec(checkpoint_dir="/data/lineage_a")


def _run(
    data: Path, spec: RunSpec, resumed_step: int | None, set_aside: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    script = "set -euo pipefail\n" + lineage_guard(spec, resumed_step, set_aside) + "\necho TRAINING"
    env = {"PATH": "/usr/bin:/bin", "SANDBOX_DATA_DIR": str(data)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False, timeout=30)


def _steps(data: Path, *steps: int | str) -> None:
    for step in steps:
        (data / "lineage_a" / (f"step_{step}" if isinstance(step, int) else step)).mkdir(parents=True)


@pytest.mark.parametrize(
    ("present", "resumed", "trains"),
    [
        ((), None, True),  # resume=none, a fresh directory
        (("tmp_step_3", "old_step_2"), None, True),  # NeMo RL resumes only from step_N
        ((5,), None, False),  # resume=none on a directory that holds a step
        ((5, 10), 10, True),  # resume=latest: the lineage's newest step is the highest one there
        ((5, 10, 12), 10, False),  # a newer step the lineage did not export
        ((), 10, False),  # resume=latest with its checkpoint missing
    ],
)
def test_the_job_trains_only_from_the_step_resume_asked_for(
    tmp_path: Path, present: tuple[int | str, ...], resumed: int | None, trains: bool
) -> None:
    _steps(tmp_path, *present)
    ran = _run(tmp_path, SPEC, resumed)
    if trains:
        assert (ran.returncode, ran.stdout, ran.stderr) == (0, "TRAINING\n", "")
    else:
        assert ran.returncode == LINEAGE_EXIT and ran.stdout == ""
        assert ran.stderr.startswith("nemo-rl-gke: not started: ")


def test_the_refusal_names_the_step_found_and_the_fix(tmp_path: Path) -> None:
    _steps(tmp_path, 5, 10, 12)
    ran = _run(tmp_path, RunSpec(checkpoint_dir="/data/lineage_a", resume="latest"), 10)
    assert ran.stderr.strip() == (
        "nemo-rl-gke: not started: resume=latest continues this DAG's lineage from step 10, but the newest "
        "checkpoint in checkpoint_dir /data/lineage_a is step_12, which this lineage did not export (another DAG's, "
        "or a failed run's). Fix: a checkpoint_dir of its own for this DAG, or resume=none with an empty one."
    )


PROMOTED = RunSpec(checkpoint_dir="/data/lineage_a", resume="promoted")


def test_a_promoted_resume_sets_the_later_nights_aside_and_keeps_them(tmp_path: Path) -> None:
    # Published step 3; nights 6 and 9 were exported but not promoted.
    _steps(tmp_path, 3, 6, 9)
    (tmp_path / "lineage_a/step_9/weights").write_text("night 3")
    ran = _run(tmp_path, PROMOTED, 3, (6, 9))
    assert ran.returncode == 0 and ran.stdout.endswith("TRAINING\n"), ran.stderr
    assert sorted(p.name for p in (tmp_path / "lineage_a").iterdir()) == ["not_promoted", "step_3"]
    kept = sorted((tmp_path / "lineage_a/not_promoted").iterdir())
    assert [p.name.split(".")[0] for p in kept] == ["step_6", "step_9"]
    assert (kept[1] / "weights").read_text() == "night 3"
    assert "set aside step_6 (not promoted)" in ran.stdout

    # The next promoted night sets aside its own later step beside the first ones.
    _steps(tmp_path, 12)
    assert _run(tmp_path, PROMOTED, 3, (6, 9, 12)).returncode == 0
    assert len(list((tmp_path / "lineage_a/not_promoted").iterdir())) == 3


def test_a_promoted_resume_still_refuses_a_step_the_lineage_did_not_export(tmp_path: Path) -> None:
    _steps(tmp_path, 3, 6, 7)
    ran = _run(tmp_path, PROMOTED, 3, (6,))
    assert ran.returncode == LINEAGE_EXIT
    assert "resume=promoted continues this DAG's lineage from step 3" in ran.stderr and "step_7" in ran.stderr
    assert (tmp_path / "lineage_a/step_7").is_dir()


def test_set_aside_reaches_the_shell_only_as_integers() -> None:
    with pytest.raises(ValueError):
        lineage_guard(PROMOTED, 3, ("6; rm -rf /",))  # type: ignore[arg-type]
