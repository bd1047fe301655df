"""The validator on the v2 worker's Automodel layout (``model_save_format=safetensors``): checkpoints the local trainer
wrote with torch's Hugging Face writer (the same sharded files, ``DCP_SHARDING_INFO`` and ``.hf_metadata`` Automodel
writes), then broken one way at a time. Each damage is a problem of its own check, named in words."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from nemo_rl_gke.remote.report import Report
from nemo_rl_gke.remote.validator import validate_checkpoint
from tests.recipes.test_grpo_cpu import DEFAULT_OVERRIDES, run_trainer

RANKS = 8
V2 = ["policy.dtensor_cfg._v2=true", "checkpointing.model_save_format=safetensors"]
PLAIN = {"step": 1, "training_ranks": RANKS, "layout": {"format": "safetensors"}}
CONSOLIDATED = {"step": 1, "training_ranks": RANKS, "layout": {"format": "safetensors", "consolidated": True}}


def _one_step(base: Path, *extra: str) -> Path:
    done = run_trainer(base, *DEFAULT_OVERRIDES[:2], "grpo.max_num_steps=1", *DEFAULT_OVERRIDES[3:], *V2, *extra)
    assert done.returncode == 0, done.stderr
    return base / "data" / "ckpt"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One step saved each way: sharded with its HF metadata, and with the consolidated Hugging Face copy."""
    return {
        "plain": _one_step(tmp_path_factory.mktemp("plain")),
        "consolidated": _one_step(tmp_path_factory.mktemp("consolidated"), "checkpointing.save_consolidated=true"),
    }


@pytest.fixture
def plain(built: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the sharded checkpoint, to break."""
    return Path(shutil.copytree(built["plain"], tmp_path / "ckpt"))


@pytest.fixture
def consolidated(built: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the consolidated checkpoint, to break."""
    return Path(shutil.copytree(built["consolidated"], tmp_path / "ckpt"))


def _model(ckpt: Path) -> Path:
    return ckpt / "step_1" / "policy" / "weights" / "model"


def _shard(ckpt: Path, rank: int) -> Path:
    return _model(ckpt) / f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"


def _problems(report: Report) -> dict[str, list[str]]:
    assert not report.valid
    found: dict[str, list[str]] = {}
    for problem in report.problems:
        found.setdefault(problem.check, []).append(f"{Path(problem.path).name}: {problem.reason}")
    return found


def _rewrite_header(path: Path, edit: object) -> None:
    """Rewrite a safetensors file's JSON header through ``edit`` (the data after it is kept)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)  # type: ignore[operator]
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def test_both_real_saves_are_valid_and_each_is_refused_as_the_other(built: dict[str, Path]) -> None:
    report = validate_checkpoint(built["plain"], PLAIN)
    assert report.valid, report.to_text()
    assert report.shards["weights"] == RANKS and report.tensors > 0
    assert validate_checkpoint(built["consolidated"], CONSOLIDATED).valid
    # The consolidated expectation on a save without the copy, and the v1 one on either: refused.
    assert set(_problems(validate_checkpoint(built["plain"], CONSOLIDATED))) == {"consolidated"}
    assert not validate_checkpoint(built["plain"], {"step": 1, "training_ranks": RANKS}).valid


def test_a_missing_rank_file_is_named(plain: Path) -> None:
    _shard(plain, 2).unlink()
    reasons = _problems(validate_checkpoint(plain, PLAIN))["shards"]
    assert any("holds 7 sharded safetensors file(s), expected 8" in r for r in reasons)
    assert any(r.startswith("shard-00003-model-00001-of-00001.safetensors: missing shard of rank 2") for r in reasons)


def test_a_truncated_file_is_refused_without_reading_it(plain: Path) -> None:
    shard = _shard(plain, 0)
    shard.write_bytes(shard.read_bytes()[:-16])
    first, *rest = _problems(validate_checkpoint(plain, PLAIN))["shards"]
    assert first.startswith(f"{_shard(plain, 0).name}: tensor ") and first.endswith("data bytes (truncated?)")
    # Its pieces are then missing from every tensor it held a part of.
    assert rest and all("do not tile" in r or "its chunks cover" in r for r in rest), rest


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (struct.pack("<Q", 1 << 40), "past the file"),
        (struct.pack("<Q", 2) + b"[]", "is a list, not an object"),
        (struct.pack("<Q", 3) + b"{x}", "header is not JSON"),
        (b"\x01\x02", "too short for a safetensors header"),
    ],
)
def test_a_header_that_is_not_safetensors_is_refused(plain: Path, head: bytes, why: str) -> None:
    _shard(plain, 1).write_bytes(head)
    reasons = _problems(validate_checkpoint(plain, PLAIN))["shards"]
    assert any(why in r for r in reasons), reasons


def test_pieces_that_overlap_or_leave_a_gap_do_not_tile_the_model(plain: Path) -> None:
    # Rank 1 claims rank 0's place for every tensor: a piece is covered twice and another not at all.
    def claim_rank0(header: dict) -> None:
        info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        for fqn in info:
            info[fqn]["saved_offsets"] = [0] * len(info[fqn]["saved_offsets"])
        header["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)

    _rewrite_header(_shard(plain, 1), claim_rank0)
    reasons = _problems(validate_checkpoint(plain, PLAIN))["shards"]
    assert any("do not tile" in r or "overlap" in r for r in reasons), reasons


def test_a_file_without_its_places_in_the_model_is_refused(plain: Path) -> None:
    _rewrite_header(_shard(plain, 3), lambda header: header.pop("__metadata__", None))
    first, *_ = _problems(validate_checkpoint(plain, PLAIN))["shards"]
    assert "has no DCP_SHARDING_INFO in its __metadata__" in first


def test_the_hf_metadata_must_be_there_and_parse(plain: Path) -> None:
    metadata = _model(plain) / ".hf_metadata"
    (metadata / "fqn_to_file_index_mapping.json").write_text("{not json")
    [reason] = _problems(validate_checkpoint(plain, PLAIN))["hf_metadata"]
    assert reason.startswith("fqn_to_file_index_mapping.json: fqn_to_file_index_mapping.json is not valid JSON")
    shutil.rmtree(metadata)
    [reason] = _problems(validate_checkpoint(plain, PLAIN))["hf_metadata"]
    assert "ConsolidatedHFAddon writes the model's config.json" in reason


def test_an_unfinished_consolidation_leaves_the_hf_metadata_behind(consolidated: Path) -> None:
    (_model(consolidated) / ".hf_metadata").mkdir()
    [reason] = _problems(validate_checkpoint(consolidated, CONSOLIDATED))["consolidated"]
    assert "it did not finish" in reason


def test_the_consolidated_index_must_name_files_that_hold_its_tensors(consolidated: Path) -> None:
    index = _model(consolidated) / "consolidated" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["lm_head.extra"] = "model-00001-of-00001.safetensors"
    data["weight_map"]["other"] = "../../../escape.safetensors"
    index.write_text(json.dumps(data))
    reasons = _problems(validate_checkpoint(consolidated, CONSOLIDATED))["consolidated"]
    assert any("not a model-*-of-*.safetensors" in r for r in reasons), reasons
    assert any("lm_head.extra is not in it" in r for r in reasons), reasons


def test_the_optimizer_lives_under_optim(plain: Path) -> None:
    shutil.rmtree(plain / "step_1" / "policy" / "optimizer" / "optim")
    assert not validate_checkpoint(plain, PLAIN).valid
    # A run saved without its optimizer (save_optimizer=false) expects none.
    assert validate_checkpoint(plain, {**PLAIN, "layout": {"format": "safetensors", "optimizer": False}}).valid


def test_the_tokenizer_is_expected_unless_the_release_saves_none(plain: Path) -> None:
    shutil.rmtree(plain / "step_1" / "policy" / "tokenizer")
    assert "tokenizer" in _problems(validate_checkpoint(plain, PLAIN))
    # v0.5.0's v2 worker gives Automodel no tokenizer: its expectation says so.
    assert validate_checkpoint(plain, {**PLAIN, "layout": {"format": "safetensors", "tokenizer": False}}).valid
