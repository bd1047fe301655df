"""The checkpoint validator against real torch.distributed.checkpoint saves (no mocks).

A 4-rank FSDP2 save (gloo on 127.0.0.1), a 1-rank FSDP2 (DTensor) save, a single-process save and a single-process
save of mixed dtypes and Python values are built once per module in NeMo RL's layout, then copied per test and
broken in one way each. Every file in a checkpoint is untrusted, so the hostile cases are real files too: crafted
pickles, symlinks, sparse oversized files and YAML alias bombs.
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import json
import os
import pickle
import random
import shlex
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import yaml

from nemo_rl_gke.remote import limits, unpickler
from nemo_rl_gke.remote.expectation import Expectation, ExpectationError
from nemo_rl_gke.remote.report import MARKER, Report, find_report
from nemo_rl_gke.remote.validator import validate_checkpoint
from tests.paths import ROOT

# The folder the validation job ships as remote/ in its working_dir.
REMOTE = ROOT / "plugins" / "nemo_rl_gke" / "remote"
RANKS = 4
STEP = 5
MODEL = "Qwen/Qwen2.5-7B-Instruct"
EXPECT = {
    "step": STEP,
    "training_ranks": RANKS,
    "config": {
        "policy.model_name": MODEL,
        "grpo.max_num_steps": STEP,
        "policy.dtensor_cfg.tensor_parallel_size": 1,
        "cluster.num_nodes": 1,
        "cluster.gpus_per_node": RANKS,
        "policy.generation.colocated.enabled": True,
    },
}
# 3 parameter tensors + 2 biases in the model; Adam keeps step, exp_avg and exp_avg_sq per parameter.
WEIGHT_TENSORS = 5
TENSORS = WEIGHT_TENSORS * 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # The last layer has fewer rows than there are ranks, so FSDP2 gives rank 3 empty shards of it.
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 3))


def _train_one_step(model: torch.nn.Module) -> torch.optim.Optimizer:
    # Set the gradients directly: one optimizer step is all it takes to create the Adam state to save.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    return optimizer


def _save_rank(rank: int, world: int, port: int, step_dir: str) -> None:
    """One training rank of the multi-rank fixture: FSDP2 on a CPU mesh, then NeMo RL's two dcp.save calls."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        model = _model()
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = _train_one_step(model)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state}, checkpoint_id=os.path.join(step_dir, "policy", "weights"))
        dcp.save({"optim": optim_state}, checkpoint_id=os.path.join(step_dir, "policy", "optimizer"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(ranks: int, steps: int) -> dict:
    """The part of NeMo RL's master config the expectation looks at, nested as config.yaml holds it."""
    return {
        "grpo": {"max_num_steps": steps, "async_grpo": {"enabled": False}},
        "policy": {
            "model_name": MODEL,
            "dtensor_cfg": {"_v2": False, "tensor_parallel_size": 1},
            "generation": {"colocated": {"enabled": True}},
        },
        "cluster": {"num_nodes": 1, "gpus_per_node": ranks},
        "checkpointing": {"enabled": True, "model_save_format": None},
    }


def _write_run_files(step_dir: Path, step: int, config: dict) -> None:
    """What NeMo RL writes besides the DCP shards: config, training info, dataloader state, tokenizer."""
    (step_dir / "config.yaml").write_text(yaml.safe_dump(config))
    info = {
        "consumed_samples": step * 64,
        "current_step": step,
        "current_epoch": 0,
        "total_steps": step,
        "total_valid_tokens": 123456,
        "val:accuracy": 0.42,
    }
    (step_dir / "training_info.json").write_text(json.dumps(info))
    torch.save({"_num_yielded": step, "_sampler_iter_yielded": step * 64}, step_dir / "train_dataloader.pt")
    tokenizer = step_dir / "policy" / "tokenizer"
    tokenizer.mkdir(parents=True)
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    (tokenizer / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (tokenizer / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Good checkpoints, written as tmp_step_N and renamed to step_N like finalize_checkpoint does."""
    base = tmp_path_factory.mktemp("checkpoints")
    multi = base / "multi"
    tmp = multi / f"tmp_step_{STEP}"
    tmp.mkdir(parents=True)
    _write_run_files(tmp, STEP, _config(RANKS, STEP))
    mp.spawn(_save_rank, args=(RANKS, _free_port(), str(tmp)), nprocs=RANKS, join=True)
    tmp.rename(multi / f"step_{STEP}")

    # One rank under gloo: FSDP2 still makes every parameter and optimizer state a DTensor.
    dtensor = base / "dtensor"
    tmp = dtensor / "tmp_step_3"
    tmp.mkdir(parents=True)
    _write_run_files(tmp, 3, _config(1, 3))
    mp.spawn(_save_rank, args=(1, _free_port(), str(tmp)), nprocs=1, join=True)
    tmp.rename(dtensor / "step_3")

    single = base / "single"
    step_dir = single / "step_3"
    step_dir.mkdir(parents=True)
    _write_run_files(step_dir, 3, _config(1, 3))
    model = _model()
    optimizer = _train_one_step(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": a single-process save, as intended
        dcp.save({"model": model.state_dict()}, checkpoint_id=step_dir / "policy" / "weights")
        dcp.save({"optim": optimizer.state_dict()}, checkpoint_id=step_dir / "policy" / "optimizer")

    # bf16 weights plus fp16/int64/bool/fp32 tensors and plain Python values (saved as bytes entries).
    mixed = base / "mixed"
    step_dir = mixed / "step_3"
    step_dir.mkdir(parents=True)
    _write_run_files(step_dir, 3, _config(1, 3))
    weights = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    extra = {
        "fp16": torch.ones(4, 2, dtype=torch.float16),
        "int64": torch.arange(6),
        "bool": torch.ones(3, dtype=torch.bool),
        "fp32": torch.zeros(2),
        "seed": 1234,
        "name": "run",
        "lr": 1e-3,
        "schedule": [1, 2],
        "meta": {"a": None},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": weights, "extra": extra}, checkpoint_id=step_dir / "policy" / "weights")
        dcp.save({"optim": optimizer.state_dict()}, checkpoint_id=step_dir / "policy" / "optimizer")
    return {"multi": multi, "single": single, "dtensor": dtensor, "mixed": mixed}


@pytest.fixture
def ckpt(built: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the good 4-rank checkpoint directory, to break."""
    return Path(shutil.copytree(built["multi"], tmp_path / "ckpt"))


def step_path(ckpt: Path, *parts: str) -> Path:
    return ckpt.joinpath(f"step_{STEP}", *parts)


def reasons(report: Report, check: str) -> list[str]:
    """'path: reason' of every problem of one check."""
    return [f"{p.path}: {p.reason}" for p in report.problems if p.check == check]


def assert_only(report: Report, *checks: str) -> None:
    assert not report.valid
    assert {p.check for p in report.problems} == set(checks), report.to_text()


@pytest.fixture
def no_plain_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own .metadata reader and every plain pickle/torch loader fail: only the restricted unpickler reads."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("checkpoint content was unpickled without the allowlist")

    monkeypatch.setattr(dcp.FileSystemReader, "read_metadata", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)


# --- good checkpoints --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_plain_unpickling")
def test_good_multi_rank_checkpoint_is_valid(ckpt: Path) -> None:
    report = validate_checkpoint(ckpt, EXPECT)
    assert report.valid, report.to_text()
    assert report.step == STEP and report.path == str(step_path(ckpt))
    assert report.shards == {"weights": RANKS, "optimizer": RANKS}
    assert report.tensors == TENSORS
    shards = sorted(step_path(ckpt, "policy").glob("*/__*_0.distcp"))
    assert len(shards) == 2 * RANKS
    assert report.total_bytes == sum(p.stat().st_size for p in shards) > 0
    assert report.training_info["total_steps"] == STEP
    recorded = {f.path: f for f in report.files}
    assert {
        f"step_{STEP}/config.yaml",
        f"step_{STEP}/training_info.json",
        f"step_{STEP}/train_dataloader.pt",
        f"step_{STEP}/policy/weights/.metadata",
        f"step_{STEP}/policy/optimizer/.metadata",
        f"step_{STEP}/policy/tokenizer/tokenizer_config.json",
        f"step_{STEP}/policy/tokenizer/tokenizer.json",
        f"step_{STEP}/policy/tokenizer/special_tokens_map.json",
    } == set(recorded)
    meta = step_path(ckpt, "policy", "weights", ".metadata")
    record = recorded[f"step_{STEP}/policy/weights/.metadata"]
    assert (record.size, record.sha256) == (meta.stat().st_size, hashlib.sha256(meta.read_bytes()).hexdigest())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["valid"] is True and data["problems"] == [] and data["total_bytes"] == report.total_bytes
    assert data["expect"] == {**EXPECT, "stopped": False, "layout": {}} and data["notes"] == []


@pytest.mark.usefixtures("no_plain_unpickling")
@pytest.mark.parametrize(
    ("name", "tensors"),
    [
        ("single", TENSORS),
        ("dtensor", TENSORS),
        # 5 bf16 weights + 4 extra tensors; the Python values are bytes entries, not tensors.
        ("mixed", WEIGHT_TENSORS + 4 + WEIGHT_TENSORS * 3),
    ],
)
def test_good_one_rank_checkpoints_are_valid(built: dict[str, Path], tmp_path: Path, name: str, tensors: int) -> None:
    # The plain loaders are booby-trapped: these real saves validate through the DCP allowlist alone.
    ckpt = shutil.copytree(built[name], tmp_path / "ckpt")
    report = validate_checkpoint(ckpt, {"step": 3, "training_ranks": 1, "grpo.max_num_steps": 3})
    assert report.valid, report.to_text()
    assert report.shards == {"weights": 1, "optimizer": 1} and report.tensors == tensors


class _RecordingUnpickler(pickle.Unpickler):
    """A plain unpickler that notes every global asked for (only ever used on the fixtures' trusted saves)."""

    def __init__(self, file: object, seen: set[tuple[str, str]]) -> None:
        super().__init__(file)
        self.seen = seen

    def find_class(self, module: str, name: str) -> object:
        self.seen.add((module, name))
        return super().find_class(module, name)


def test_allowlist_is_exactly_what_dcp_save_writes(built: dict[str, Path]) -> None:
    # Every global that torch's dcp.save put in these .metadata files (plain, optimizer, mixed dtypes and Python
    # values, FSDP2 DTensors on 1 and 4 gloo ranks) is allowed, and nothing is allowed that none of them needed.
    seen: set[tuple[str, str]] = set()
    metas = sorted(p for base in built.values() for p in base.rglob(".metadata"))
    assert len(metas) == 2 * len(built)
    for meta in metas:
        with meta.open("rb") as handle:
            _RecordingUnpickler(handle, seen).load()
    dtypes = {(module, name) for module, name in seen if isinstance(getattr(torch, name, None), torch.dtype)}
    assert {("torch", name) for name in ("bfloat16", "float32", "float16", "int64", "bool")} <= dtypes
    assert seen - dtypes == set(unpickler.DCP_PICKLE_GLOBALS)
    allowed = unpickler.dcp_globals()
    assert seen <= set(allowed)
    assert ("torch", "complex128") in allowed and ("torch", "float8_e4m3fn") in allowed  # every dtype
    assert ("torch", "load") not in allowed and ("torch", "tensor") not in allowed


def test_without_a_step_the_highest_is_validated(ckpt: Path) -> None:
    # keep_top_k leaves older steps behind; without an expected step the newest one is the run's result.
    shutil.copytree(step_path(ckpt), ckpt / "step_2")
    report = validate_checkpoint(ckpt, {"training_ranks": RANKS})
    assert report.valid and report.step == STEP, report.to_text()


def test_without_training_ranks_shards_must_still_be_ranks_0_to_n(ckpt: Path) -> None:
    assert validate_checkpoint(ckpt).valid
    step_path(ckpt, "policy", "optimizer", "__1_0.distcp").unlink()
    report = validate_checkpoint(ckpt)
    assert f"step_{STEP}/policy/optimizer/__1_0.distcp: missing shard of rank 1" in reasons(report, "shards")


# --- step directories --------------------------------------------------------------------------------------------


def test_only_tmp_step_means_the_save_did_not_finish(ckpt: Path) -> None:
    step_path(ckpt).rename(ckpt / f"tmp_step_{STEP}")
    report = validate_checkpoint(ckpt, EXPECT)
    assert report.step is None and report.path is None
    assert reasons(report, "step") == [
        f"tmp_step_{STEP}: the save of step {STEP} did not finish: tmp_step_{STEP} was never renamed to "
        f"step_{STEP} (NeMo RL renames it only after the weights, optimizer, tokenizer and dataloader are written)"
    ]
    # Without an expected step the same holds: there is nothing finished to validate.
    assert "did not finish" in validate_checkpoint(ckpt).problems[0].reason


def test_leftover_tmp_step_next_to_a_good_step_is_rejected(ckpt: Path) -> None:
    tmp = ckpt / f"tmp_step_{STEP + 1}"
    tmp.mkdir()
    shutil.copy(step_path(ckpt, "training_info.json"), tmp)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "step")
    assert reasons(report, "step") == [
        f"tmp_step_{STEP + 1}: leftover tmp_step_{STEP + 1}: a save of step {STEP + 1} started but did not "
        "finish, so the run did not end cleanly"
    ]
    assert report.step == STEP  # the finished step is still checked and reported


def test_a_job_stopped_after_its_save_may_leave_a_later_save_unfinished(ckpt: Path) -> None:
    # A converged job is stopped once step N is saved; the stop can cut the next save short. Only with "stopped".
    tmp = ckpt / f"tmp_step_{STEP + 5}"
    tmp.mkdir()
    report = validate_checkpoint(ckpt, {**EXPECT, "stopped": True})
    assert report.valid and report.step == STEP
    assert report.notes == [f"tmp_step_{STEP + 5}: the save the stop after step {STEP} cut short"]
    assert f"note: tmp_step_{STEP + 5}" in report.to_text()
    # An unfinished save of the expected step itself is still a problem, stopped or not.
    step_path(ckpt).rename(ckpt / f"tmp_step_{STEP}")
    assert "did not finish" in reasons(validate_checkpoint(ckpt, {**EXPECT, "stopped": True}), "step")[0]


@pytest.mark.parametrize("stopped", ["yes", 1, None])
def test_stopped_must_be_a_bool(stopped: object) -> None:
    with pytest.raises(ExpectationError, match="stopped must be true or false"):
        Expectation.from_dict({"step": 3, "stopped": stopped})
    with pytest.raises(ExpectationError, match="true only with a step"):
        Expectation.from_dict({"stopped": True})


def test_expected_step_missing(ckpt: Path) -> None:
    report = validate_checkpoint(ckpt, {**EXPECT, "step": 20})
    assert reasons(report, "step") == [f"step_20: expected final step_20, found step_{STEP}"]


def test_newer_step_than_expected_is_rejected(ckpt: Path) -> None:
    shutil.copytree(step_path(ckpt), ckpt / "step_9")
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "step")
    assert reasons(report, "step")[0].startswith("step_9: step_9 is newer than the expected final step_5")


def test_missing_checkpoint_dir(tmp_path: Path) -> None:
    report = validate_checkpoint(tmp_path / "nope", EXPECT)
    assert [p.check for p in report.problems] == ["step"]
    assert "does not exist" in report.problems[0].reason


def test_step_dir_given_instead_of_its_parent(ckpt: Path) -> None:
    report = validate_checkpoint(step_path(ckpt), {})
    assert report.problems[0].reason.endswith(f"step_{STEP} looks like a step directory itself: pass its parent")


# --- shards ------------------------------------------------------------------------------------------------------


def test_missing_shard(ckpt: Path) -> None:
    step_path(ckpt, "policy", "weights", "__2_0.distcp").unlink()
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "shards", "storage")
    assert reasons(report, "shards") == [
        f"step_{STEP}/policy/weights: policy/weights holds 3 shard(s), expected 4 (one __{{rank}}_0.distcp per "
        "training rank, training_ranks=4)",
        f"step_{STEP}/policy/weights/__2_0.distcp: missing shard of rank 2",
    ]
    [storage] = reasons(report, "storage")
    assert storage.startswith(f"step_{STEP}/policy/weights/.metadata: ")
    assert storage.endswith("storage entries point at __2_0.distcp, which does not exist")
    assert report.shards == {"weights": 3, "optimizer": 4}


@pytest.mark.parametrize("ranks", [8, 2])
def test_wrong_shard_count_for_the_runs_ranks(ckpt: Path, ranks: int) -> None:
    report = validate_checkpoint(ckpt, {**EXPECT, "training_ranks": ranks})
    assert_only(report, "shards")
    found = reasons(report, "shards")
    for part in ("weights", "optimizer"):
        assert (
            f"step_{STEP}/policy/{part}: policy/{part} holds 4 shard(s), expected {ranks} (one __{{rank}}_0.distcp "
            f"per training rank, training_ranks={ranks})"
        ) in found
    if ranks == 8:
        assert f"step_{STEP}/policy/weights/__7_0.distcp: missing shard of rank 7" in found
    else:
        assert (
            f"step_{STEP}/policy/optimizer/__3_0.distcp: unexpected shard of rank 3: the run has 2 training rank(s)"
        ) in found


def test_empty_shard(ckpt: Path) -> None:
    step_path(ckpt, "policy", "optimizer", "__1_0.distcp").write_bytes(b"")
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "shards", "storage")
    assert reasons(report, "shards") == [f"step_{STEP}/policy/optimizer/__1_0.distcp: shard is empty (0 bytes)"]


def test_shard_shorter_than_its_storage_entries(ckpt: Path) -> None:
    shard = step_path(ckpt, "policy", "weights", "__3_0.distcp")
    size = shard.stat().st_size
    with shard.open("r+b") as handle:
        handle.truncate(size // 2)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "storage")
    assert reasons(report, "storage") == [
        f"step_{STEP}/policy/weights/.metadata: __3_0.distcp is {size // 2} bytes but .metadata has entries up to "
        f"byte {size}: the shard is shorter than its storage entries (truncated)"
    ]


def test_unexpected_shard_file_name(ckpt: Path) -> None:
    shutil.copy(
        step_path(ckpt, "policy", "weights", "__0_0.distcp"), step_path(ckpt, "policy", "weights", "__0_1.distcp")
    )
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "shards")
    assert reasons(report, "shards")[0].startswith(
        f"step_{STEP}/policy/weights/__0_1.distcp: unexpected shard file name __0_1.distcp"
    )


# --- .metadata ---------------------------------------------------------------------------------------------------


def test_truncated_metadata(ckpt: Path) -> None:
    meta = step_path(ckpt, "policy", "weights", ".metadata")
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "metadata")
    [reason] = reasons(report, "metadata")
    assert reason.startswith(
        f"step_{STEP}/policy/weights/.metadata: policy/weights/.metadata ({meta.stat().st_size} bytes) is "
        "unreadable, truncated or not a DCP metadata file: "
    )
    assert "Error" in reason  # the exception's name, e.g. EOFError or UnpicklingError
    assert report.tensors == WEIGHT_TENSORS * 3  # the optimizer's metadata was still read


def test_garbage_metadata(ckpt: Path) -> None:
    step_path(ckpt, "policy", "optimizer", ".metadata").write_bytes(random.Random(0).randbytes(4096))
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "metadata")
    [reason] = reasons(report, "metadata")
    assert f"step_{STEP}/policy/optimizer/.metadata: policy/optimizer/.metadata (4096 bytes) is unreadable" in reason


def test_metadata_holding_another_object(ckpt: Path) -> None:
    meta = step_path(ckpt, "policy", "weights", ".metadata")
    meta.write_bytes(pickle.dumps({"not": "metadata"}))  # plain data needs no global: read, then rejected
    assert reasons(validate_checkpoint(ckpt, EXPECT), "metadata") == [
        f"step_{STEP}/policy/weights/.metadata: policy/weights/.metadata holds a dict, not a DCP Metadata"
    ]
    # An allowed DCP class in the wrong place is read, then rejected the same way.
    meta.write_bytes(pickle.dumps(dcp.metadata.BytesStorageMetadata()))
    assert reasons(validate_checkpoint(ckpt, EXPECT), "metadata") == [
        f"step_{STEP}/policy/weights/.metadata: policy/weights/.metadata holds a BytesStorageMetadata, not a DCP "
        "Metadata"
    ]
    # Any other class is not even imported.
    meta.write_bytes(pickle.dumps(SimpleNamespace(state_dict_metadata=None)))
    [reason] = reasons(validate_checkpoint(ckpt, EXPECT), "metadata")
    assert "is refused: its pickle asks for types.SimpleNamespace, which a DCP metadata file never holds" in reason


def test_missing_metadata_after_an_unfinished_save(ckpt: Path) -> None:
    weights = step_path(ckpt, "policy", "weights")
    (weights / ".metadata").rename(weights / ".metadata.tmp")
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "metadata") == [
        f"step_{STEP}/policy/weights/.metadata: missing .metadata: .metadata.tmp was never renamed, so dcp.save "
        "did not finish"
    ]


def _rewrite_metadata(ckpt: Path, fqn: str, chunk: int, offsets: list[int] | None) -> None:
    """Move one chunk of a tensor (or drop it with None) in a real .metadata, as a buggy writer could."""
    weights = step_path(ckpt, "policy", "weights")
    metadata = dcp.FileSystemReader(weights).read_metadata()
    chunks = metadata.state_dict_metadata[fqn].chunks
    if offsets is None:
        del chunks[chunk]
    else:
        chunks[chunk].offsets = torch.Size(offsets)
    (weights / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize(
    ("offsets", "reason"),
    [
        (None, "its chunks cover 384 of its 512 elements"),
        ([4, 0], "chunks at offsets [0, 0] and [4, 0] overlap"),
        ([28, 0], "chunk at offsets [28, 0] of sizes [8, 16] is out of bounds"),
    ],
)
def test_chunks_must_tile_each_tensor(ckpt: Path, offsets: list[int] | None, reason: str) -> None:
    _rewrite_metadata(ckpt, "model.0.weight", 1, offsets)
    report = validate_checkpoint(ckpt, EXPECT)
    assert f"step_{STEP}/policy/weights/.metadata: tensor model.0.weight of size [32, 16]: {reason}" in reasons(
        report, "metadata"
    )
    if offsets is not None:  # the moved chunk's data is no longer found where .metadata says
        assert (
            f"step_{STEP}/policy/weights/.metadata: no storage entry for model.0.weight chunk at offsets {offsets}"
        ) in reasons(report, "storage")


# --- config.yaml and training_info.json --------------------------------------------------------------------------


def _edit_yaml(path: Path, dotted: str, value: object) -> None:
    config = yaml.safe_load(path.read_text())
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value
    path.write_text(yaml.safe_dump(config))


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("policy.model_name", "google/gemma-3-27b-it", '"google/gemma-3-27b-it"'),
        ("grpo.max_num_steps", 20, "20"),
        ("policy.dtensor_cfg.tensor_parallel_size", 2, "2"),
        ("policy.generation.colocated.enabled", False, "false"),
        ("cluster.gpus_per_node", 8, "8"),
    ],
)
def test_config_that_does_not_match_the_run(ckpt: Path, key: str, value: object, shown: str) -> None:
    _edit_yaml(step_path(ckpt, "config.yaml"), key, value)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "config")
    want = json.dumps(EXPECT["config"][key])
    assert reasons(report, "config") == [
        f"step_{STEP}/config.yaml: {key} is {shown} in config.yaml, but the run was submitted with {want}"
    ]


def test_config_bool_is_not_an_int(ckpt: Path) -> None:
    report = validate_checkpoint(ckpt, {**EXPECT, "config": {"policy.generation.colocated.enabled": 1}})
    assert reasons(report, "config") == [
        f"step_{STEP}/config.yaml: policy.generation.colocated.enabled is true in config.yaml, but the run was "
        "submitted with 1"
    ]


def test_config_key_missing_and_unparseable(ckpt: Path) -> None:
    report = validate_checkpoint(ckpt, {"policy.lora.enabled": True})
    assert reasons(report, "config") == [
        f"step_{STEP}/config.yaml: policy.lora.enabled is missing from config.yaml; expected true"
    ]
    step_path(ckpt, "config.yaml").write_text("policy: {model_name: [unclosed\n")
    [reason] = reasons(validate_checkpoint(ckpt, EXPECT), "config")
    assert reason.startswith(f"step_{STEP}/config.yaml: config.yaml does not parse as YAML: ")


def _edit_info(ckpt: Path, **changes: object) -> None:
    path = step_path(ckpt, "training_info.json")
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps({k: v for k, v in info.items() if v is not None}))


def test_training_info_step_mismatch(ckpt: Path) -> None:
    _edit_info(ckpt, total_steps=STEP - 1)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "training_info")
    assert reasons(report, "training_info") == [
        f"step_{STEP}/training_info.json: training_info.json total_steps is {STEP - 1}, expected {STEP} for "
        f"step_{STEP} (total_steps is GRPO's step counter across epochs, which names the directory)"
    ]


def test_training_info_missing_keys(ckpt: Path) -> None:
    _edit_info(ckpt, consumed_samples=None, current_epoch=None)
    assert reasons(validate_checkpoint(ckpt, EXPECT), "training_info") == [
        f"step_{STEP}/training_info.json: training_info.json lacks consumed_samples, current_epoch (GRPOSaveState "
        "has consumed_samples, current_step, current_epoch, total_steps, total_valid_tokens)"
    ]


def test_async_grpo_is_checked_on_current_step(ckpt: Path) -> None:
    # async_grpo_train only updates current_step (its global step); total_steps keeps its initial 0.
    _edit_info(ckpt, total_steps=0, current_step=STEP)
    assert reasons(validate_checkpoint(ckpt, EXPECT), "training_info")
    _edit_yaml(step_path(ckpt, "config.yaml"), "grpo.async_grpo.enabled", True)
    assert validate_checkpoint(ckpt, EXPECT).valid
    _edit_info(ckpt, current_step=STEP - 1)
    [reason] = reasons(validate_checkpoint(ckpt, EXPECT), "training_info")
    assert f"current_step is {STEP - 1}, expected {STEP}" in reason


# --- tokenizer and dataloader ------------------------------------------------------------------------------------


def test_missing_tokenizer(ckpt: Path) -> None:
    shutil.rmtree(step_path(ckpt, "policy", "tokenizer"))
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "tokenizer")
    assert reasons(report, "tokenizer") == [
        f"step_{STEP}/policy/tokenizer: policy/tokenizer is missing: NeMo RL saves it with save_pretrained"
    ]


def test_empty_or_incomplete_tokenizer(ckpt: Path) -> None:
    tokenizer = step_path(ckpt, "policy", "tokenizer")
    (tokenizer / "tokenizer_config.json").unlink()
    (tokenizer / "tokenizer.json").write_text("")
    found = reasons(validate_checkpoint(ckpt, EXPECT), "tokenizer")
    assert found == [
        f"step_{STEP}/policy/tokenizer/tokenizer_config.json: tokenizer_config.json is missing (found "
        "special_tokens_map.json, tokenizer.json)",
        f"step_{STEP}/policy/tokenizer/tokenizer.json: tokenizer file is empty (0 bytes)",
    ]
    for path in tokenizer.iterdir():
        path.unlink()
    assert reasons(validate_checkpoint(ckpt, EXPECT), "tokenizer") == [
        f"step_{STEP}/policy/tokenizer: policy/tokenizer is empty"
    ]


def test_missing_dataloader_state(ckpt: Path) -> None:
    step_path(ckpt, "train_dataloader.pt").unlink()
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "dataloader")
    assert reasons(report, "dataloader") == [
        f"step_{STEP}/train_dataloader.pt: train_dataloader.pt is missing (torch.save(dataloader.state_dict()))"
    ]


# --- hostile .metadata: unpickling it must run nothing ------------------------------------------------------------


class _Payload:
    """Unpickles as func(*args): how a crafted .metadata runs code on whoever unpickles it."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.func, self.args


CANARY_MODULE = "nemo_rl_gke_test_canary_module"
CRAFTED = ["os.system", "builtins.exec in protocol 0", "io.open inside a real Metadata", "a module's import"]


def _crafted(kind: str, ckpt: Path, canary: Path) -> tuple[bytes, str]:
    """A crafted .metadata that creates canary when unpickled, and the global it asks pickle for."""
    if kind == "os.system":
        return pickle.dumps(_Payload(os.system, f"touch {shlex.quote(str(canary))}")), "posix.system"
    if kind == "builtins.exec in protocol 0":
        code = f"open({str(canary)!r}, 'w').close()"
        return b"cbuiltins\nexec\n(V" + code.encode() + b"\ntR.", "builtins.exec"
    if kind == "a module's import":
        # The module creates the canary when imported (it is put on sys.path by the test): asking is enough.
        return f"c{CANARY_MODULE}\nanything\n.".encode(), f"{CANARY_MODULE}.anything"
    # Everything about this one is a valid DCP Metadata but its checkpoint_id, which is a call.
    metadata = dcp.FileSystemReader(step_path(ckpt, "policy", "weights")).read_metadata()
    metadata.storage_meta.checkpoint_id = _Payload(open, str(canary), "w")
    return pickle.dumps(metadata), "io.open"


def _refused(part: str, data: bytes, asked: str) -> str:
    return (
        f"step_{STEP}/policy/{part}/.metadata: policy/{part}/.metadata ({len(data)} bytes) is refused: its pickle "
        f"asks for {asked}, which a DCP metadata file never holds; nothing was imported or run (a crafted .metadata "
        "runs code when unpickled)"
    )


@pytest.mark.parametrize("kind", CRAFTED)
def test_crafted_metadata_runs_nothing(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    canary = tmp_path / "canary"
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{CANARY_MODULE}.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(modules))
    data, asked = _crafted(kind, ckpt, canary)
    step_path(ckpt, "policy", "weights", ".metadata").write_bytes(data)
    report = validate_checkpoint(ckpt, EXPECT)
    assert not canary.exists()
    assert CANARY_MODULE not in sys.modules
    assert_only(report, "metadata")
    assert reasons(report, "metadata") == [_refused("weights", data, asked)]
    assert report.tensors == WEIGHT_TENSORS * 3  # the optimizer's metadata was still read


def test_metadata_asking_for_a_persistent_object_is_refused(ckpt: Path) -> None:
    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> str | None:
            return "fetch me from elsewhere" if obj == "outside" else None

    buffer = io.BytesIO()
    Pickler(buffer).dump({"state": "outside"})
    data = buffer.getvalue()
    step_path(ckpt, "policy", "weights", ".metadata").write_bytes(data)
    [reason] = reasons(validate_checkpoint(ckpt, EXPECT), "metadata")
    assert (
        "is refused: its pickle asks for a persistent id (an object the loader is asked to fetch from elsewhere) "
        "(opcode BINPERSID at byte "
    ) in reason
    assert "(opcode BINPERSID at byte " in reason


def test_metadata_naming_a_global_by_extension_code_is_refused(ckpt: Path, tmp_path: Path) -> None:
    # copyreg's registry maps small numbers to globals; an unpickler that honours EXT1 resolves it unasked.
    canary = tmp_path / "canary"
    copyreg.add_extension("posix", "system", 250)
    try:
        data = pickle.dumps(_Payload(os.system, f"touch {shlex.quote(str(canary))}"), protocol=2)
        step_path(ckpt, "policy", "weights", ".metadata").write_bytes(data)
        report = validate_checkpoint(ckpt, EXPECT)
    finally:
        copyreg.remove_extension("posix", "system", 250)
    assert not canary.exists()
    [reason] = reasons(report, "metadata")
    assert "is refused: its pickle asks for a copyreg extension code (a global named by number) (opcode EXT1" in reason


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            "storage offset is a string",
            "the storage entry of model.0.weight is not a file name, an offset and a length",
        ),
        ("chunk size past int64", "model.0.weight has a chunk without valid offsets and sizes"),
        ("tensor size is a string", "model.0.weight has no valid size or chunk list"),
        ("a key that is not a MetadataIndex", "a storage_data key is a str without a string fqn"),
    ],
)
def test_allowed_classes_holding_hostile_values_are_malformed(ckpt: Path, damage: str, why: str) -> None:
    # The allowlist bounds which classes exist, not what they hold: every field the checks read is checked first.
    weights = step_path(ckpt, "policy", "weights")
    metadata = dcp.FileSystemReader(weights).read_metadata()
    item = metadata.state_dict_metadata["model.0.weight"]
    index = next(i for i in metadata.storage_data if i.fqn == "model.0.weight")
    if damage == "storage offset is a string":
        metadata.storage_data[index].offset = "0"
    elif damage == "chunk size past int64":
        item.chunks[0].sizes = (10**5000, 16)
    elif damage == "tensor size is a string":
        item.size = "32x16"
    else:
        metadata.storage_data["model.0.weight"] = metadata.storage_data.pop(index)
    (weights / ".metadata").write_bytes(pickle.dumps(metadata))
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "metadata") == [
        f"step_{STEP}/policy/weights/.metadata: policy/weights/.metadata is not well-formed DCP metadata: {why}"
    ]


def test_overlap_check_is_bounded(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2x2 grid of chunks tiles model.0.weight; comparing its chunks for overlap takes two comparisons.
    weights = step_path(ckpt, "policy", "weights")
    metadata = dcp.FileSystemReader(weights).read_metadata()
    chunk = dcp.metadata.ChunkStorageMetadata
    metadata.state_dict_metadata["model.0.weight"].chunks = [
        chunk(torch.Size([row, col]), torch.Size([16, 8])) for row in (0, 16) for col in (0, 8)
    ]
    (weights / ".metadata").write_bytes(pickle.dumps(metadata))
    assert not reasons(validate_checkpoint(ckpt, EXPECT), "metadata")
    monkeypatch.setattr(limits, "MAX_OVERLAP_CHECKS", 1)
    assert reasons(validate_checkpoint(ckpt, EXPECT), "metadata") == [
        f"step_{STEP}/policy/weights/.metadata: stopped checking chunks for overlaps after 1 comparisons: no DCP "
        "save needs that many, so the chunks are laid out to make the check slow"
    ]


@pytest.mark.parametrize("rank", ["99999999999", "9" * 30])
def test_a_huge_shard_rank_is_refused(ckpt: Path, rank: str) -> None:
    # Without training_ranks the shards must be ranks 0..n-1: one crafted name must not make n a hundred billion
    # or 10**30: counting the missing ranks up to it would never end.
    weights = step_path(ckpt, "policy", "weights")
    shutil.copy(weights / "__0_0.distcp", weights / f"__{rank}_0.distcp")
    report = validate_checkpoint(ckpt)
    assert reasons(report, "shards") == [
        f"step_{STEP}/policy/weights/__{rank}_0.distcp: shard __{rank}_0.distcp names a rank beyond the 65,536 a "
        "DCP directory can hold here"
    ]
    assert report.shards == {"weights": RANKS, "optimizer": RANKS}


def test_directory_listing_is_bounded(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_DIR_ENTRIES", 3)
    found = reasons(validate_checkpoint(ckpt, EXPECT), "shards")
    assert f"step_{STEP}/policy/weights: weights holds more than 3 entries: not read further" in found


# --- hostile files: symlinks, special files, sizes ------------------------------------------------------------------


def _refused_link(ckpt: Path, link: Path, target: Path) -> str:
    return (
        f"{link.relative_to(ckpt).as_posix()}: {link.name} is a symbolic link to {target.resolve()}, outside the "
        "checkpoint directory: refused, nothing is read through it"
    )


def test_config_symlink_leaving_the_checkpoint_is_not_read(ckpt: Path, tmp_path: Path) -> None:
    config = step_path(ckpt, "config.yaml")
    # A link that stays inside the checkpoint directory is followed.
    shutil.move(config, ckpt / "shared.yaml")
    config.symlink_to(Path("..") / "shared.yaml")
    assert validate_checkpoint(ckpt, EXPECT).valid
    # So is a symlink to the checkpoint directory itself: where it lives is the caller's choice.
    alias = tmp_path / "alias"
    alias.symlink_to(ckpt, target_is_directory=True)
    assert validate_checkpoint(alias, EXPECT).valid
    # One that leaves it is refused unread: read, this config would not match the run.
    outside = tmp_path / "outside.yaml"
    other = _config(RANKS, STEP)
    other["policy"]["model_name"] = "someone/else"
    outside.write_text(yaml.safe_dump(other))
    config.unlink()
    config.symlink_to(outside)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "symlink")
    assert reasons(report, "symlink") == [_refused_link(ckpt, config, outside)]
    assert f"step_{STEP}/config.yaml" not in {f.path for f in report.files}


@pytest.mark.parametrize(
    "parts",
    [
        ("training_info.json",),
        ("train_dataloader.pt",),
        ("policy", "weights", ".metadata"),
        ("policy", "optimizer", "__2_0.distcp"),
        ("policy", "tokenizer", "tokenizer.json"),
    ],
)
def test_file_symlink_leaving_the_checkpoint_is_refused(ckpt: Path, tmp_path: Path, parts: tuple[str, ...]) -> None:
    link = step_path(ckpt, *parts)
    target = tmp_path / "outside" / link.name
    target.parent.mkdir()
    shutil.move(link, target)
    link.symlink_to(target)
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "symlink") == [_refused_link(ckpt, link, target)]
    assert link.relative_to(ckpt).as_posix() not in {f.path for f in report.files}
    if link.suffix == ".distcp":  # neither counted as a rank's shard nor sized
        shards = [p for p in step_path(ckpt, "policy").glob("*/*.distcp") if not p.is_symlink()]
        assert report.shards == {"weights": RANKS, "optimizer": RANKS - 1}
        assert report.total_bytes == sum(p.stat().st_size for p in shards)


@pytest.mark.parametrize("parts", [(), ("policy",), ("policy", "weights"), ("policy", "tokenizer")])
def test_directory_symlink_leaving_the_checkpoint_is_refused(
    ckpt: Path, tmp_path: Path, parts: tuple[str, ...]
) -> None:
    link = step_path(ckpt, *parts)
    target = tmp_path / "outside" / link.name
    target.parent.mkdir()
    shutil.move(link, target)
    link.symlink_to(target, target_is_directory=True)
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "symlink") == [_refused_link(ckpt, link, target)]
    shown = link.relative_to(ckpt).as_posix()
    assert not [f.path for f in report.files if f.path.startswith(f"{shown}/")]
    if not parts:  # the step directory itself: there is no step left to validate
        assert reasons(report, "step") == [f"step_{STEP}: expected final step_{STEP}, found no step_* directory"]
        assert report.files == [] and report.tensors == 0


def test_special_files_and_symlink_loops_are_not_read(ckpt: Path) -> None:
    config = step_path(ckpt, "config.yaml")
    config.unlink()
    os.mkfifo(config)  # opening a FIFO to read it waits for a writer that never comes
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "config") == [
        f"step_{STEP}/config.yaml: config.yaml is not a regular file (the run's master config)"
    ]
    config.unlink()
    config.symlink_to(config.name)
    assert reasons(validate_checkpoint(ckpt, EXPECT), "symlink") == [
        f"step_{STEP}/config.yaml: config.yaml is a symbolic link that loops: refused, nothing is read through it"
    ]


@pytest.mark.parametrize(
    ("parts", "limit", "check", "what"),
    [
        (("config.yaml",), "MAX_CONFIG_BYTES", "config", "the run's master config"),
        (("training_info.json",), "MAX_TRAINING_INFO_BYTES", "training_info", "GRPO's save state"),
        (("policy", "weights", ".metadata"), "MAX_METADATA_BYTES", "metadata", "DCP metadata"),
        (
            ("policy", "tokenizer", "tokenizer_config.json"),
            "MAX_TOKENIZER_CONFIG_BYTES",
            "tokenizer",
            "the tokenizer's config",
        ),
    ],
)
def test_oversized_file_is_a_problem_and_not_read(
    ckpt: Path, parts: tuple[str, ...], limit: str, check: str, what: str
) -> None:
    path = step_path(ckpt, *parts)
    size = getattr(limits, limit) + 1
    with path.open("r+b") as handle:
        handle.truncate(size)  # sparse: the real content, then a hole that costs no disk
    report = validate_checkpoint(ckpt, EXPECT)
    shown = path.relative_to(ckpt).as_posix()
    assert (
        f"{shown}: {path.name} is {size:,} bytes, over the validator's limit of {size - 1:,} bytes for {what}: not read"
        in (reasons(report, check))
    )
    assert shown not in {f.path for f in report.files}


def test_oversized_tokenizer_file_is_not_hashed(ckpt: Path) -> None:
    path = step_path(ckpt, "policy", "tokenizer", "tokenizer.json")
    size = limits.MAX_HASHED_BYTES + 1
    with path.open("r+b") as handle:
        handle.truncate(size)
    report = validate_checkpoint(ckpt, EXPECT)
    assert_only(report, "files")
    assert reasons(report, "files") == [
        f"step_{STEP}/policy/tokenizer/tokenizer.json: tokenizer.json is {size:,} bytes, over the {size - 1:,} bytes "
        "it may hash"
    ]


# 9 levels of 9 aliases: under 300 bytes that expand to 9**9 (387 million) strings.
BILLION_LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            BILLION_LAUGHS,
            "config.yaml's aliases expand it past 1,000,000 nodes (a YAML alias bomb); yaml.safe_dump of a NeMo RL "
            "config comes nowhere near that",
        ),
        (
            "policy: &p {model_name: *p}\n",
            "config.yaml has a recursive alias (a node that contains an alias to itself)",
        ),
    ],
)
def test_yaml_alias_bombs_are_refused(ckpt: Path, text: str, why: str) -> None:
    config = step_path(ckpt, "config.yaml")
    # A few aliases, as yaml.safe_dump writes for a list shared by two keys, still parse.
    data = _config(RANKS, STEP)
    data["shared"] = data["extra"] = [1, 2, 3]
    config.write_text(yaml.safe_dump(data))
    assert "&id001" in config.read_text()
    assert validate_checkpoint(ckpt, EXPECT).valid
    config.write_text(text)
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "config") == [f"step_{STEP}/config.yaml: config.yaml is refused: {why}"]


def test_config_nesting_too_deep_to_parse(ckpt: Path) -> None:
    # PyYAML composes nodes recursively: 5,000 nested lists exhaust Python's stack.
    step_path(ckpt, "config.yaml").write_text("policy: " + "[" * 5000 + "]" * 5000 + "\n")
    assert reasons(validate_checkpoint(ckpt, EXPECT), "config") == [
        f"step_{STEP}/config.yaml: config.yaml nests too deeply to parse"
    ]


def test_config_value_too_big_to_print(ckpt: Path) -> None:
    # YAML hex integers have no length limit in Python; printed in decimal, one would raise.
    config = step_path(ckpt, "config.yaml")
    config.write_text(config.read_text().replace(f"gpus_per_node: {RANKS}", "gpus_per_node: 0x" + "f" * 5000))
    assert reasons(validate_checkpoint(ckpt, EXPECT), "config") == [
        f"step_{STEP}/config.yaml: cluster.gpus_per_node is <a int> in config.yaml, but the run was submitted with "
        f"{RANKS}"
    ]


def test_training_info_nesting_is_bounded(ckpt: Path) -> None:
    path = step_path(ckpt, "training_info.json")
    path.write_text(path.read_text()[:-1] + ', "deep": ' + "[" * 900 + "]" * 900 + "}")
    report = validate_checkpoint(ckpt, EXPECT)
    assert reasons(report, "training_info") == [
        f"step_{STEP}/training_info.json: training_info.json nests deeper than 32 levels"
    ]
    assert json.loads(json.dumps(report.to_dict()))["training_info"] == {}


# --- expectation and report helpers ------------------------------------------------------------------------------


def test_expectation_parsing() -> None:
    expect = Expectation.from_dict({"step": 3, "cluster.num_nodes": 2, "config": {"policy.model_name": "m"}})
    assert expect == Expectation(step=3, config={"policy.model_name": "m", "cluster.num_nodes": 2})
    with pytest.raises(ExpectationError, match="unknown expectation key"):
        Expectation.from_dict({"training_rank": 4})
    with pytest.raises(ExpectationError, match="training_ranks must be an integer >= 1"):
        Expectation.from_dict({"training_ranks": 0})
    with pytest.raises(ExpectationError, match="step must be an integer"):
        Expectation.from_dict({"step": True})


def test_find_report_takes_the_last_whole_marker_line() -> None:
    log = f'noise\n(driver) {MARKER}{{"valid": false}}\n{MARKER}{{"valid": true}}\n{MARKER}{{"cut'
    assert find_report(log) == {"valid": True}
    assert find_report("no marker here") is None


# --- command line ------------------------------------------------------------------------------------------------


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, check=False
    )


def _marker_report(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
    assert len(lines) == 1 and stdout.strip() == lines[0]
    return json.loads(lines[0][len(MARKER) :])


def test_cli_script_is_self_contained(ckpt: Path, tmp_path: Path) -> None:
    # The Ray job gets only this folder in its working_dir: run a copy from an empty dir, no PYTHONPATH.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    shutil.copytree(REMOTE, job_dir / "remote", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run(["-c", "import nemo_rl_gke"], job_dir).returncode == 1  # so the package cannot be reached

    good = _run(["-m", "remote", "validate", str(ckpt), "--expect", json.dumps(EXPECT)], job_dir)
    assert good.returncode == 0, good.stderr
    data = _marker_report(good.stdout)
    assert data["valid"] is True and data["step"] == STEP and data["shards"] == {"weights": 4, "optimizer": 4}
    assert data["tensors"] == TENSORS and data["total_bytes"] > 0 and len(data["files"]) == 8
    assert good.stderr.startswith(f"OK: checkpoint {step_path(ckpt)} is valid")

    step_path(ckpt, "policy", "weights", "__2_0.distcp").unlink()
    bad = _run(["-m", "remote", "validate", str(ckpt), "--expect", json.dumps(EXPECT)], job_dir)
    assert bad.returncode == 1, bad.stderr
    data = _marker_report(bad.stdout)
    assert data["valid"] is False
    assert {
        "check": "shards",
        "path": f"step_{STEP}/policy/weights/__2_0.distcp",
        "reason": "missing shard of rank 2",
    } in (data["problems"])

    usage = _run(["-m", "remote", "validate", str(ckpt), "--expect", '{"training_rank": 4}'], job_dir)
    assert usage.returncode == 2 and usage.stdout == ""
    assert usage.stderr.startswith("error: unknown expectation key(s) training_rank")


def test_cli_module_text_format_with_expect_file(ckpt: Path, tmp_path: Path) -> None:
    expect_file = tmp_path / "expect.json"
    expect_file.write_text(json.dumps(EXPECT))
    env = {"PYTHONPATH": str(ROOT / "plugins")}
    args = ["-m", "nemo_rl_gke.remote", "validate", str(ckpt), "--expect-file", str(expect_file)]
    good = _run([*args, "--format", "text"], tmp_path, env)
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert lines[0] == f"OK: checkpoint {step_path(ckpt)} is valid"
    assert lines[1].startswith(f"step {STEP}; shards: weights 4, optimizer 4; {TENSORS} tensors; ")

    (ckpt / "tmp_step_6").mkdir()
    bad = _run([*args, "--format", "text"], tmp_path, env)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[:2] == [
        f"INVALID: checkpoint {step_path(ckpt)} has 1 problem(s):",
        "  1. [step] tmp_step_6: leftover tmp_step_6: a save of step 6 started but did not finish, so the run did "
        "not end cleanly",
    ]


def test_module_import_and_help_do_not_need_torch(tmp_path: Path) -> None:
    # torch is imported only to read .metadata, so --help and the DAG-side helpers work without it.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from nemo_rl_gke.remote.cli import main\n"
        "sys.exit(main(['validate', '--help']))"
    )
    result = _run(["-c", code], tmp_path, {"PYTHONPATH": str(ROOT / "plugins")})
    assert result.returncode == 0, result.stderr
    assert "--expect-file" in result.stdout


@pytest.mark.parametrize("form", ["script", "module"])
def test_cli_runs_nothing_from_a_crafted_metadata(ckpt: Path, tmp_path: Path, form: str) -> None:
    # Both documented commands: the Ray job's `python -m remote` and the laptop's `python -m nemo_rl_gke.remote`.
    canary = tmp_path / "canary"
    data, asked = _crafted("os.system", ckpt, canary)
    step_path(ckpt, "policy", "optimizer", ".metadata").write_bytes(data)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    shutil.copytree(REMOTE, job_dir / "remote", ignore=shutil.ignore_patterns("__pycache__"))
    command = ["-m", "remote"] if form == "script" else ["-m", "nemo_rl_gke.remote"]
    env = {"PYTHONPATH": str(ROOT / "plugins")} if form == "module" else None
    result = _run([*command, "validate", str(ckpt), "--expect", json.dumps(EXPECT)], job_dir, env)
    assert result.returncode == 1, result.stderr
    assert not canary.exists()
    report = _marker_report(result.stdout)
    assert report["valid"] is False and report["tensors"] == WEIGHT_TENSORS
    assert report["problems"] == [
        {
            "check": "metadata",
            "path": f"step_{STEP}/policy/optimizer/.metadata",
            "reason": _refused("optimizer", data, asked).split(": ", 1)[1],
        }
    ]


def test_the_remote_folder_imports_only_itself_the_stdlib_yaml_and_torch() -> None:
    # It runs on the cluster without the package: no Airflow, no nemo_rl_gke module, only relative imports inside.
    import ast

    allowed = set(sys.stdlib_module_names) | {"yaml", "torch"}
    sources = sorted(REMOTE.glob("*.py"))
    assert {"__main__.py", "cli.py", "unpickler.py", "validator.py"} <= {s.name for s in sources}
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            outside = [n for n in names if n.split(".")[0] not in allowed]
            assert outside == [], f"{source.name} imports {outside}"
