"""The local CPU GRPO trainer (include/recipes/local/grpo_cpu.py), run for real as a subprocess.

Each run copies the script and its config into a job directory, the way the Ray job's working_dir arrives, and
points SANDBOX_DATA_DIR at a temporary directory standing for the /data Lustre mount. The default 20-step run is
shared by the tests that read its log and checkpoints; the others use few steps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tests.paths import ROOT

LOCAL = ROOT / "include" / "recipes" / "local"
# What the recipe ships in the job's working_dir: the trainer, its policy's Hugging Face model, the base config.
TRAINER_FILES = ("grpo_cpu.py", "modeling_tiny_policy.py", "config.yaml")
# The overrides the recipe renders for the default local run (cluster 1x8, colocated, 8 prompts x 8 generations).
DEFAULT_OVERRIDES = [
    "cluster.num_nodes=1",
    "cluster.gpus_per_node=8",
    "grpo.max_num_steps=20",
    "checkpointing.checkpoint_dir=/data/ckpt",
    "grpo.num_prompts_per_step=8",
    "grpo.num_generations_per_prompt=8",
    "policy.generation.colocated.enabled=true",
    "policy.generation.vllm_cfg.tensor_parallel_size=1",
    "policy.dtensor_cfg.tensor_parallel_size=1",
]
REWARD = re.compile(r"^  • Avg Reward: (\S+)$", re.MULTILINE)
LOSS = re.compile(r"^  • Loss: (\S+)$", re.MULTILINE)
STEP = re.compile(r"^={25} Step (\d+)/(\d+) ={25}$", re.MULTILINE)


def run_trainer(base: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """Run grpo_cpu.py from a fresh job dir under ``base``, with ``base/data`` standing for /data."""
    job = base / "job"
    job.mkdir(parents=True, exist_ok=True)
    for name in TRAINER_FILES:
        shutil.copy(LOCAL / name, job / name)
    env = {**os.environ, "SANDBOX_DATA_DIR": str(base / "data")}
    return subprocess.run(
        [sys.executable, "grpo_cpu.py", "--config", "config.yaml", *overrides],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def rewards(stdout: str) -> list[float]:
    """The Avg Reward of every step, in order."""
    return [float(x) for x in REWARD.findall(stdout)]


def mean(values: list[float]) -> float:
    """Arithmetic mean."""
    return sum(values) / len(values)


def assert_covering_shards(directory: Path, ranks: int) -> None:
    """``directory`` holds one non-empty DCP shard per rank and its metadata covers every tensor exactly once."""
    shards = sorted(p.name for p in directory.glob("*.distcp"))
    assert shards == sorted(f"__{rank}_0.distcp" for rank in range(ranks))
    metadata = FileSystemReader(str(directory)).read_metadata()
    used: dict[str, int] = {}
    for item in metadata.storage_data.values():
        assert item.relative_path in shards
        end = item.offset + item.length
        assert end <= (directory / item.relative_path).stat().st_size
        used[item.relative_path] = max(used.get(item.relative_path, 0), end)
    assert sorted(used) == shards, "every rank's shard holds part of the state"
    assert all(size > 0 for size in used.values())
    tensors = 0
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        tensors += 1
        covered = torch.zeros(tuple(entry.size), dtype=torch.int32)
        for chunk in entry.chunks:
            region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
            covered[region] += 1
        assert bool((covered == 1).all()), f"{key} is not covered exactly once by its chunks"
    assert tensors > 0


def load_checkpoint(directory: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint, gathered from all its shards, by dotted key."""
    dcp_to_torch_save(str(directory), str(scratch))
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        elif isinstance(node, torch.Tensor):
            flat[prefix.rstrip(".")] = node

    walk("", torch.load(scratch, weights_only=True))
    assert flat
    return flat


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The recipe's default run: 20 steps on a 1x8 cluster, checkpoints to /data/ckpt."""
    base = tmp_path_factory.mktemp("default")
    result = run_trainer(base, *DEFAULT_OVERRIDES)
    assert result.returncode == 0, result.stderr
    return base, result


@pytest.fixture(scope="module")
def trainer() -> Iterator[ModuleType]:
    """The trainer module itself, for its pure helpers (registered while loading: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location("grpo_cpu", LOCAL / "grpo_cpu.py")  # puts LOCAL on sys.path
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_reward_rises_on_the_default_run(default_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    values = rewards(default_run[1].stdout)
    assert len(values) == 20
    assert mean(values[-5:]) - mean(values[:5]) > 0.3, values


def test_every_step_prints_nemo_rl_markers(default_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    stdout = default_run[1].stdout
    assert [(int(k), int(total)) for k, total in STEP.findall(stdout)] == [(k, 20) for k in range(1, 21)]
    per_step = [
        r"^📊 Training Results:$",
        r"^  • Loss: -?\d+\.\d{4}$",
        r"^  • Generation KL Error: \d+\.\d{4}$",
        r"^  • Avg Reward: \d\.\d{4}$",
        r"^  • Mean Generation Length: \d+\.\d{4}$",
        r"^⏱️  Timing:$",
        r"^  • Total step time: \d+\.\d{2}s$",
        r"^  • policy_training: \d+\.\d{2}s \(\d+\.\d%\)$",
        r"^  • generation: \d+\.\d{2}s \(\d+\.\d%\)$",
        r"^  • policy_and_reference_logprobs: \d+\.\d{2}s \(\d+\.\d%\)$",
        r"^🔍 Performance Metrics:$",
        r"^    - E2E \(Tokens/sec/gpu\): \d+\.\d{2}$",
        r"^    - Training Worker Group \(Tokens/sec/gpu\): \d+\.\d{2}$",
        r"^    - Generation Worker Group \(Tokens/sec/gpu\): \d+\.\d{2}$",
        r"^    - Generation Worker Group \(Tokens/sec\): \d+\.\d{2}$",
    ]
    for pattern in per_step:
        assert len(re.findall(pattern, stdout, re.MULTILINE)) == 20, pattern
    # Validation every grpo.val_period=10 steps, and checkpoints at save_period=10 and the last step.
    assert len(re.findall(r"^📊 Validation Results:$", stdout, re.MULTILINE)) == 2
    assert len(re.findall(r"^    • Accuracy: \d\.\d{4}$", stdout, re.MULTILINE)) == 2
    assert re.findall(r"^Saving checkpoint for step (\d+)\.\.\.$", stdout, re.MULTILINE) == ["10", "20"]


def test_the_dags_log_parser_reads_every_step(default_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    metrics = pytest.importorskip("nemo_rl_gke.observe.metrics")
    zero_learning = pytest.importorskip("nemo_rl_gke.observe.zero_learning")
    follower = metrics.LogFollower()
    follower.feed(default_run[1].stdout)
    follower.flush()
    steps = follower.metrics.completed_steps
    assert [s.label for s in steps] == [f"{k}/20" for k in range(1, 21)]
    assert all(s.avg_reward is not None and s.loss is not None and s.kl_error is not None for s in steps)
    assert all({"policy_training", "generation"} <= set(s.phase_times_s) for s in steps)
    assert all({"Training Worker Group", "Generation Worker Group"} <= set(s.group_tokens_per_s_per_gpu) for s in steps)
    assert [s.step for s in steps if s.val_accuracy is not None] == [10, 20]
    assert follower.metrics.checkpoints == [10, 20]
    assert zero_learning.check_zero_learning(steps, 3) is None


def test_checkpoints_use_nemo_rl_layout_with_a_shard_per_rank(
    default_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    root = default_run[0] / "data" / "ckpt"
    assert sorted(p.name for p in root.iterdir()) == ["step_10", "step_20"], "no tmp_step_N is left behind"
    for step in (10, 20):
        ckpt = root / f"step_{step}"
        info = json.loads((ckpt / "training_info.json").read_text())
        assert info["total_steps"] == info["current_step"] == step
        assert info["consumed_samples"] == 8 * step
        assert info["current_epoch"] == 0
        assert info["total_valid_tokens"] > 0
        assert 0.0 <= info["val:accuracy"] <= 1.0
        config = yaml.safe_load((ckpt / "config.yaml").read_text())
        assert config["checkpointing"]["checkpoint_dir"] == "/data/ckpt"
        assert config["grpo"]["max_num_steps"] == 20
        assert config["cluster"]["gpus_per_node"] == 8
        assert torch.load(ckpt / "train_dataloader.pt", weights_only=True)["batches_yielded"] == step
        tokenizer = ckpt / "policy" / "tokenizer"
        vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
        assert {"<eos>", "+", "-", "10"} <= set(vocab)
        assert json.loads((tokenizer / "tokenizer_config.json").read_text())["eos_token"] == "<eos>"
        assert json.loads((tokenizer / "special_tokens_map.json").read_text())["pad_token"] == "<pad>"
        for part in ("weights", "optimizer"):
            assert_covering_shards(ckpt / "policy" / part, ranks=8)
    # The eight shards put back together are the whole model and optimizer, under NeMo RL's keys.
    weights = load_checkpoint(root / "step_20" / "policy" / "weights", tmp_path / "weights.pt")
    assert weights["model.embed.weight"].shape[1] == 64
    assert {"model.encoder.weight_ih_l0", "model.decoder.weight_hh", "model.lm_head.weight"} <= set(weights)
    optimizer = load_checkpoint(root / "step_20" / "policy" / "optimizer", tmp_path / "optimizer.pt")
    assert float(optimizer["optim.optim.state.embed.weight.step"]) == 20
    assert optimizer["optim.optim.state.embed.weight.exp_avg"].shape == weights["model.embed.weight"].shape


def test_training_ranks_when_generation_has_its_own_gpus(tmp_path: Path) -> None:
    result = run_trainer(
        tmp_path,
        "grpo.max_num_steps=1",
        "checkpointing.checkpoint_dir=/data/split",
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.gpus_per_node=6",
    )
    assert result.returncode == 0, result.stderr
    weights = tmp_path / "data" / "split" / "step_1" / "policy" / "weights"
    assert_covering_shards(weights, ranks=2)


def test_resume_continues_from_the_latest_step_and_exits_when_done(
    tmp_path: Path, default_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    first = run_trainer(
        tmp_path, "grpo.max_num_steps=5", "checkpointing.save_period=5", "checkpointing.checkpoint_dir=/data/r"
    )
    assert first.returncode == 0, first.stderr
    root = tmp_path / "data" / "r"
    assert sorted(p.name for p in root.iterdir()) == ["step_5"]
    # A save that died half-way is ignored, as NeMo RL ignores it.
    (root / "tmp_step_9" / "policy").mkdir(parents=True)

    resumed = run_trainer(tmp_path, "grpo.max_num_steps=10", "checkpointing.checkpoint_dir=/data/r")
    assert resumed.returncode == 0, resumed.stderr
    assert f"Loading weights from {root / 'step_5' / 'policy' / 'weights'}" in resumed.stdout
    assert [int(k) for k, _ in STEP.findall(resumed.stdout)] == [6, 7, 8, 9, 10]
    # Weights, optimizer state and data order all came back: the run goes on exactly as the uninterrupted one.
    assert REWARD.findall(resumed.stdout) == REWARD.findall(default_run[1].stdout)[5:10]
    for part in ("weights", "optimizer"):
        mine = load_checkpoint(root / "step_10" / "policy" / part, tmp_path / f"mine-{part}.pt")
        reference = load_checkpoint(
            default_run[0] / "data" / "ckpt" / "step_10" / "policy" / part, tmp_path / f"ref-{part}.pt"
        )
        assert mine.keys() == reference.keys()
        assert all(torch.equal(mine[key], reference[key]) for key in mine), part

    done = run_trainer(tmp_path, "grpo.max_num_steps=10", "checkpointing.checkpoint_dir=/data/r")
    assert done.returncode == 0, done.stderr
    assert "nothing to train" in done.stdout
    assert not STEP.findall(done.stdout)
    assert sorted(p.name for p in root.iterdir()) == ["step_10", "step_5", "tmp_step_9"]


def test_full_solution_ground_truth_never_rewards(tmp_path: Path) -> None:
    result = run_trainer(
        tmp_path,
        "data.ground_truth=full_solution",
        "grpo.max_num_steps=5",
        "grpo.val_period=5",
        "checkpointing.enabled=false",
    )
    assert result.returncode == 0, result.stderr
    assert REWARD.findall(result.stdout) == ["0.0000"] * 5
    # All rewards equal: every advantage is 0, so is the policy gradient, and the KL term stays 0.
    assert LOSS.findall(result.stdout) == ["0.0000"] * 5
    assert re.findall(r"^    • Accuracy: (\S+)$", result.stdout, re.MULTILINE) == ["0.0000"]
    metrics = pytest.importorskip("nemo_rl_gke.observe.metrics")
    zero_learning = pytest.importorskip("nemo_rl_gke.observe.zero_learning")
    follower = metrics.LogFollower()
    follower.feed(result.stdout)
    assert zero_learning.check_zero_learning(follower.metrics.completed_steps, 3) is not None


def test_checkpoint_must_save_by_saves_and_stops_as_nemo_rl_does(tmp_path: Path) -> None:
    # A deadline already reached: NeMo RL's TimeoutChecker makes the first step save, then training stops (exit 0).
    result = run_trainer(
        tmp_path,
        *DEFAULT_OVERRIDES,
        "checkpointing.save_period=10",
        "checkpointing.checkpoint_must_save_by=00:00:00:00",
    )
    assert result.returncode == 0, result.stderr
    assert STEP.findall(result.stdout) == [("1", "20")]
    assert "Saving checkpoint for step 1..." in result.stdout
    assert result.stdout.rstrip().endswith("Timeout has been reached, stopping training early")
    assert sorted(p.name for p in (tmp_path / "data" / "ckpt").iterdir()) == ["step_1"]
    metrics = pytest.importorskip("nemo_rl_gke.observe.metrics")
    follower = metrics.LogFollower()
    follower.feed(result.stdout)
    assert follower.metrics.timeout_reached and metrics.newest_save(follower.metrics.steps) == 1


def test_a_far_deadline_changes_nothing_and_a_bad_one_names_the_key(tmp_path: Path) -> None:
    result = run_trainer(
        tmp_path / "far",
        *DEFAULT_OVERRIDES,
        "grpo.max_num_steps=2",
        "checkpointing.checkpoint_must_save_by=01:00:00:00",
    )
    assert result.returncode == 0, result.stderr
    assert "Timeout has been reached" not in result.stdout and len(STEP.findall(result.stdout)) == 2
    bad = run_trainer(tmp_path / "bad", "checkpointing.checkpoint_must_save_by=3h")
    assert bad.returncode == 2 and "'checkpointing.checkpoint_must_save_by'" in bad.stderr


def test_hang_after_step_prints_nothing_more_and_never_exits(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for name in TRAINER_FILES:
        shutil.copy(LOCAL / name, job / name)
    overrides = [*DEFAULT_OVERRIDES, "checkpointing.save_period=1", "sandbox.hang_after_step=2"]
    process = subprocess.Popen(
        [sys.executable, "-u", "grpo_cpu.py", "--config", "config.yaml", *overrides],
        cwd=job,
        env={**os.environ, "SANDBOX_DATA_DIR": str(tmp_path / "data")},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            # The last line of a step's results; after step 2's the trainer is silent and alive.
            if sum("Generation Worker Group (Tokens/sec)" in seen for seen in lines) == 2:
                with pytest.raises(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
                break
        text = "\n".join(lines)
        assert STEP.findall(text) == [("1", "20"), ("2", "20")], text[-2000:]
        assert process.poll() is None
        assert sorted(p.name for p in (tmp_path / "data" / "ckpt").iterdir()) == ["step_1", "step_2"]
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.no_such_key=1", "'grpo.no_such_key'"),
        ("+grpo.seed=7", "'grpo.seed'"),
        ("data.ground_truth=boxed", "'data.ground_truth'"),
        ("policy.train_global_batch_size=12", "'policy.train_global_batch_size'"),
    ],
)
def test_bad_override_fails_naming_the_key(tmp_path: Path, override: str, message: str) -> None:
    result = run_trainer(tmp_path, override, "checkpointing.checkpoint_dir=/data/bad")
    assert result.returncode == 2
    assert message in result.stderr
    assert "error" in result.stderr
    assert not STEP.findall(result.stdout)
    assert not (tmp_path / "data" / "bad").exists()


def test_override_semantics(trainer: ModuleType) -> None:
    config = {"a": {"b": 1, "c": {"d": "x"}}}
    trainer.apply_override(config, "a.b=2")
    trainer.apply_override(config, "+a.e=true")
    trainer.apply_override(config, "++a.f.g='it\\'s'")
    trainer.apply_override(config, "++a.b=null")
    trainer.apply_override(config, "~a.c")
    assert config == {"a": {"b": None, "e": True, "f": {"g": "it's"}}}
    for bad in ("a.zz=1", "+a.b=1", "~a.zz", "a", "a.b.c=1"):
        with pytest.raises(trainer.ConfigError):
            trainer.apply_override(config, bad)


def test_grader_matches_only_the_final_answer(trainer: ModuleType) -> None:
    problem = trainer.make_problem(trainer.random.Random(3), 10, 0.0)
    truth = trainer.ground_truth(problem, "final_answer")
    assert problem.answer.endswith(f"#### {truth}")
    calculation = re.search(r"<<(\d+)([+-])(\d+)=", problem.answer)
    assert calculation is not None
    response = trainer.calculate(" ".join(calculation.groups()))
    assert trainer.reward(response, truth) == 1.0
    assert trainer.reward(response, trainer.ground_truth(problem, "full_solution")) == 0.0
    assert trainer.reward(calculation[1], truth) == 0.0, "a response that computes nothing has no final answer"
    assert trainer.calculate("7 - 2 + 4") == "7 - 2 + 4 = 9"
    assert trainer.final_answer("3 + 4 +") is None


def test_step_delay_is_read_from_the_sandbox_key_and_checked(trainer: ModuleType) -> None:
    config = yaml.safe_load((LOCAL / "config.yaml").read_text())
    assert trainer.read_settings(config).step_delay_s == 0.0
    trainer.apply_override(config, "sandbox.step_delay_s=1.5")
    assert trainer.read_settings(config).step_delay_s == 1.5
    trainer.apply_override(config, "sandbox.step_delay_s=-1")
    with pytest.raises(trainer.ConfigError, match=r"sandbox\.step_delay_s"):
        trainer.read_settings(config)


# --- the model that comes out: the Hugging Face export and the evaluation -------------------------------------------

MODEL_OUT_FILES = ("convert_to_hf.py", "run_eval.py", "eval.yaml")
SCORE = re.compile(r"^score=(\d\.\d{4}) \(([\d.]+)/(\d+)\)$", re.MULTILINE)


def _job_dir(base: Path) -> Path:
    """The working_dir the conversion and evaluation jobs get: the trainer's files and the model-out scripts."""
    job = base / "job"
    for name in (*TRAINER_FILES, *MODEL_OUT_FILES):
        shutil.copy(LOCAL / name, job / name)
    return job


def _run(job: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = None if env is None else {**os.environ, **env}
    return subprocess.run(
        [sys.executable, *args], cwd=job, capture_output=True, text=True, check=False, env=environment
    )


def test_the_export_loads_with_transformers_generates_and_scores_above_the_untrained_model(
    default_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    # The default 20-step run's final checkpoint (v1 DCP), converted as the conversion job does it.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, _ = default_run
    job = _job_dir(base)
    step = base / "data" / "ckpt" / "step_20"
    hf = base / "hf-step-20"
    converted = _run(job, "convert_to_hf.py", "--config", str(step / "config.yaml"), "--dcp-ckpt-path",
                     str(step / "policy" / "weights"), "--hf-ckpt-path", str(hf))  # fmt: skip
    assert converted.returncode == 0, converted.stderr
    assert {"config.json", "model.safetensors", "modeling_tiny_policy.py", "tokenizer.json"} <= {
        p.name for p in hf.iterdir()
    }
    assert _run(job, "convert_to_hf.py", "--config", str(step / "config.yaml"), "--dcp-ckpt-path",
                str(step / "policy" / "weights"), "--hf-ckpt-path", str(hf)).returncode == 1  # fmt: skip

    # transformers loads it (the model's own code, the fast tokenizer) and it writes a calculation.
    model = AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    question = "Betty had 9 shells and gave 4 of them to a friend. How many shells does Betty have left?"
    inputs = tokenizer(question, return_tensors="pt")
    written = model.generate(**inputs, max_new_tokens=8)[0, inputs["input_ids"].shape[1] :]
    assert re.fullmatch(r"\d+( [+-] \d+)*", tokenizer.decode(written, skip_special_tokens=True))

    # On held-out problems (none of the training split's), the trained model beats the untrained one it started from.
    scores = {}
    for name in (str(hf), "local/tiny-policy"):
        # Its own temporary directory, left empty: the base model's tokenizer files are written there and removed.
        tmp = base / f"tmp-{len(scores)}"
        tmp.mkdir()
        evaluated = _run(job, "run_eval.py", "--config", "eval.yaml", f"generation.model_name={name}",
                         env={"TMPDIR": str(tmp)})  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stderr
        assert list(tmp.iterdir()) == [], name
        found = SCORE.search(evaluated.stdout)
        assert found is not None, evaluated.stdout
        scores[name] = float(found.group(1))
        assert int(found.group(3)) == 256 and "metric=pass@1 num_tests_per_prompt=1" in evaluated.stdout
    trained, untrained = scores[str(hf)], scores["local/tiny-policy"]
    assert trained > untrained + 0.2, scores
    print(f"\nheld-out score: trained {trained:.4f}, untrained {untrained:.4f}")


def test_the_v2_layout_validates_resumes_and_converts(tmp_path: Path) -> None:
    # The v2 worker's Automodel layout (model_save_format=safetensors, consolidated): sharded files with their places
    # in the model, the HF metadata moved into consolidated/; a later run resumes from it, and the export reads it.
    from nemo_rl_gke.remote.validator import validate_checkpoint

    v2 = ["policy.dtensor_cfg._v2=true", "checkpointing.model_save_format=safetensors", "checkpointing.save_period=2"]
    first = run_trainer(tmp_path, *DEFAULT_OVERRIDES[:2], "grpo.max_num_steps=2", *DEFAULT_OVERRIDES[3:], *v2,
                        "checkpointing.save_consolidated=true")  # fmt: skip
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "data" / "ckpt"
    model = ckpt / "step_2" / "policy" / "weights" / "model"
    assert sorted(p.name for p in model.glob("shard-*")) == [
        f"shard-{i:05d}-model-00001-of-00001.safetensors" for i in range(1, 9)
    ]
    assert {p.name for p in (model / "consolidated").iterdir()} == {
        "config.json", "generation_config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"
    }  # fmt: skip
    layout = {"format": "safetensors", "consolidated": True}
    report = validate_checkpoint(ckpt, {"step": 2, "training_ranks": 8, "layout": layout})
    assert report.valid, report.to_text()
    # The v1 expectation (what the validator took every checkpoint for before) refuses the same checkpoint.
    assert not validate_checkpoint(ckpt, {"step": 2, "training_ranks": 8}).valid

    resumed = run_trainer(tmp_path, *DEFAULT_OVERRIDES[:2], "grpo.max_num_steps=4", *DEFAULT_OVERRIDES[3:], *v2)
    assert resumed.returncode == 0, resumed.stderr
    assert "Loading weights from" in resumed.stdout and "Step 3/" in resumed.stdout
    report = validate_checkpoint(ckpt, {"step": 4, "training_ranks": 8, "layout": {"format": "safetensors"}})
    assert report.valid, report.to_text()
    job = _job_dir(tmp_path)
    step = ckpt / "step_4"
    converted = _run(job, "convert_to_hf.py", "--config", str(step / "config.yaml"), "--dcp-ckpt-path",
                     str(step / "policy" / "weights"), "--hf-ckpt-path", str(tmp_path / "hf"))  # fmt: skip
    assert converted.returncode == 0, converted.stderr
