"""The model that comes out, below the operators: the layout each release writes, the conversion and evaluation jobs
it gets, the base model's score key, and the publish decision."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_rl_gke.decide.publish import decide
from nemo_rl_gke.plan import model_out
from nemo_rl_gke.run import publish
from nemo_rl_gke.run.checkpoint_layout import DCP, SAFETENSORS, TORCH_SAVE, CheckpointLayout, layout_of
from nemo_rl_gke.run.spec import RunSpec, default_conf

GEMMA = "gemma3-27b-gsm8k-v0.5.0"
QWEN = "qwen2.5-7b-gsm8k-v0.7.0"
LOCAL = "local-cpu-gsm8k"


def _spec(recipe: str, **conf: object) -> RunSpec:
    tp = {GEMMA: 8, QWEN: 2, LOCAL: 1}[recipe]
    return RunSpec.from_conf({**default_conf(), "recipe": recipe, "dtensor_tp": tp, "vllm_tp": tp, **conf})


# --- the layout -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "config", "layout"),
    [
        ("v0.5.0", {"policy.dtensor_cfg._v2": False}, CheckpointLayout(DCP)),
        # v2 without a format: Automodel's default, sharded safetensors; v0.5.0 gives it no tokenizer.
        ("v0.5.0", {"policy.dtensor_cfg._v2": True}, CheckpointLayout(SAFETENSORS, tokenizer=False)),
        ("v0.7.0", {"policy.dtensor_cfg._v2": True, "checkpointing.model_save_format": "safetensors"},
         CheckpointLayout(SAFETENSORS)),
        ("v0.7.0", {"policy.dtensor_cfg._v2": True, "checkpointing.save_consolidated": True},
         CheckpointLayout(SAFETENSORS, consolidated=True)),
        # save_consolidated is ignored by the torch_save path, and by v1.
        ("v0.7.0", {"policy.dtensor_cfg._v2": True, "checkpointing.model_save_format": "torch_save",
                    "checkpointing.save_consolidated": True}, CheckpointLayout(TORCH_SAVE)),
        ("v0.7.0", {"policy.dtensor_cfg._v2": False, "checkpointing.save_consolidated": True}, CheckpointLayout(DCP)),
        ("v0.7.0", {"policy.dtensor_cfg._v2": True, "checkpointing.save_optimizer": False},
         CheckpointLayout(SAFETENSORS, optimizer=False)),
    ],
)  # fmt: skip
def test_the_layout_each_release_writes(version: str, config: dict, layout: CheckpointLayout) -> None:
    assert layout_of(version, config) == layout
    assert CheckpointLayout.from_dict(layout.to_dict()) == layout


def test_the_pinned_recipes_layouts() -> None:
    assert model_out.load_recipe(GEMMA).effective_config(_spec(GEMMA)).get("policy.dtensor_cfg._v2") is not True
    qwen = model_out.load_recipe(QWEN).effective_config(_spec(QWEN))
    assert layout_of("v0.7.0", qwen) == CheckpointLayout(SAFETENSORS)
    # The v0.7.0 recipe saves synchronously: its background save is never waited for (recipe comment).
    assert qwen.get("checkpointing.is_async") is False


# --- the conversion job -----------------------------------------------------------------------------------------


def _convert(spec: RunSpec) -> model_out.JobRequest:
    return model_out.conversion_job(spec, "dag", "run", "nemo-rl-run-abc", step=40)


def test_the_v1_layout_converts_with_the_releases_converter_then_to_safetensors() -> None:
    job = _convert(_spec(GEMMA))
    assert job.submission_id == "nemo-rl-run-abc-hf" and job.metadata["purpose"] == "hf-export"
    lines = job.entrypoint.splitlines()
    assert lines[0] == "set -euo pipefail" and "cd /opt/nemo-rl" in lines
    assert any(f'{model_out.CONVERTER} --config "$step/config.yaml"' in line for line in lines)
    assert any('hf_safetensors.py" "$step/hf.tmp"' in line for line in lines)
    # Written aside and renamed at the end: a retried job finds all of it or nothing; one that finds hf/ is done.
    assert lines[-2] == 'mv "$step/hf.tmp" "$step/hf"' and 'the export is done"; exit 0; fi' in job.entrypoint
    assert job.working_dir_files == model_out.SCRIPTS and job.env_vars == {"HF_HOME": "/data/hf_home"}


def test_the_v2_sharded_layout_is_consolidated_by_automodel_on_a_copy_with_the_releases_tokenizer() -> None:
    job = _convert(_spec(QWEN))
    assert model_out.AUTOMODEL_CONSOLIDATION in job.entrypoint and model_out.CONVERTER not in job.entrypoint
    assert 'cp -r "$step/policy/weights/model" "$work/model"' in job.entrypoint
    assert "--model-name Qwen/Qwen2.5-7B-Instruct" in job.entrypoint
    assert 'cp -r "$step/policy/tokenizer/." "$step/hf.tmp"/' in job.entrypoint


def test_the_consolidated_copy_is_the_hugging_face_model() -> None:
    job = _convert(_spec(QWEN, extra_overrides=["checkpointing.save_consolidated=true"]))
    assert 'cp -r "$step/policy/weights/model/consolidated" "$step/hf.tmp"' in job.entrypoint
    assert model_out.AUTOMODEL_CONSOLIDATION not in job.entrypoint


def test_v0_5_0s_v2_save_takes_the_base_models_tokenizer() -> None:
    job = _convert(_spec(GEMMA, extra_overrides=["policy.dtensor_cfg._v2=true"]))
    assert "AutoTokenizer.from_pretrained(sys.argv[1])" in job.entrypoint and "google/gemma-3-27b-it" in job.entrypoint
    assert "policy/tokenizer" not in job.entrypoint


def test_the_local_recipe_runs_its_stand_in_and_ships_it() -> None:
    job = _convert(_spec(LOCAL))
    assert "python convert_to_hf.py --config" in job.entrypoint
    assert set(model_out.LOCAL_CONVERT_FILES) <= set(job.working_dir_files)


def test_the_step_directory_is_quoted_for_the_shell() -> None:
    job = _convert(_spec(LOCAL, checkpoint_dir="/data/it's here"))
    assert "step=\"${SANDBOX_DATA_DIR:-/data}\"'/it'\"'\"'s here/step_40'" in job.entrypoint


# --- the evaluation job -----------------------------------------------------------------------------------------


def test_the_evaluation_of_the_export_and_of_the_base_model() -> None:
    spec = _spec(QWEN, eval_num_tests_per_prompt=4, eval_temperature=0.6, eval_max_tokens=2048)
    run = model_out.evaluation_job(spec, "dag", "run", "nemo-rl-run-abc", step=40)
    base = model_out.evaluation_job(spec, "dag", "run", "nemo-rl-run-abc", step=None)
    assert (run.submission_id, base.submission_id) == ("nemo-rl-run-abc-eval", "nemo-rl-run-abc-eval-base")
    assert 'generation.model_name="$step/hf"' in run.entrypoint
    assert "generation.model_name=Qwen/Qwen2.5-7B-Instruct" in base.entrypoint and "$step" not in base.entrypoint
    for job in (run, base):
        last = job.entrypoint.splitlines()[-1]
        assert f"{model_out.EVALUATOR} --config {model_out.EVAL_CONFIG}" in last
        for setting in (
            "eval.num_tests_per_prompt=4",
            "generation.temperature=0.6",
            "generation.vllm_cfg.max_model_len=2048",
            "generation.vllm_cfg.tensor_parallel_size=2",
        ):
            assert setting in last
        # GSM8K's test split, written as JSONL first and read as a local math dataset.
        assert "gsm8k_to_jsonl.py" in job.entrypoint and "/test.jsonl data.file_format=json" in last


def test_a_named_benchmark_is_the_releases_dataset() -> None:
    job = model_out.evaluation_job(_spec(QWEN, eval_benchmark="math500"), "d", "r", "s", step=1)
    assert "data.dataset_name=math500" in job.entrypoint and "gsm8k_to_jsonl" not in job.entrypoint


def test_no_evaluation_job_when_eval_is_off() -> None:
    with pytest.raises(ValueError, match="eval_benchmark is off"):
        model_out.evaluation_job(_spec(LOCAL, eval_benchmark="off", publish="always"), "d", "r", "s", step=1)


def test_the_base_models_score_is_reused_only_for_the_same_settings() -> None:
    spec = _spec(QWEN)
    key = model_out.baseline_key(spec)
    assert key == model_out.baseline_key(dataclasses.replace(spec, max_steps=99, publish_margin=0.5))
    for change in ({"eval_temperature": 0.7}, {"eval_benchmark": "math500"}, {"eval_max_tokens": 1024},
                   {"eval_num_tests_per_prompt": 2, "eval_temperature": 0.6}):  # fmt: skip
        assert model_out.baseline_key(dataclasses.replace(spec, **change)) != key, change
    assert model_out.baseline_key(_spec(GEMMA))["model"] == "google/gemma-3-27b-it"


# --- the publish decision ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "score", "last", "outcome", "reason"),
    [
        ("never", 0.9, None, publish.NOT_PUBLISHED, "publish=never: the checkpoint is exported, nothing is published"),
        ("always", 0.1, 0.9, publish.PROMOTED, "publish=always: every run's model is published"),
        ("if_better", None, 0.5, publish.NOT_PROMOTED,
         "publish=if_better, but the model has no score (the evaluation did not run)"),
        ("if_better", 0.2, None, publish.PROMOTED, "the first published model of this lineage (score 0.2000)"),
        ("if_better", 0.55, 0.5, publish.PROMOTED,
         "score 0.5500 is at least the published model's 0.5000 + margin 0.05"),
        ("if_better", 0.54, 0.5, publish.NOT_PROMOTED,
         "score 0.5400 is below the published model's 0.5000 + margin 0.05 = 0.5500"),
    ],
)  # fmt: skip
def test_the_publish_decision(policy: str, score: float | None, last: float | None, outcome: str, reason: str) -> None:
    published = None if last is None else {"score": last, "uri": "gs://b/x/"}
    decision = decide(policy, 0.05, score, baseline=0.1, published=published)
    assert (decision.outcome, decision.reason) == (outcome, reason)
    assert decision.promoted is (outcome == publish.PROMOTED)
    assert decision.to_dict() == {"outcome": outcome, "reason": reason, "score": score, "baseline": 0.1,
                                  "published": last}  # fmt: skip


@pytest.mark.parametrize("last", ["0.9", True, None, [0.9]])
def test_a_published_event_without_a_numeric_score_counts_as_none_published(last: object) -> None:
    # An event another producer wrote (or a hand-made one) cannot block every later model.
    decision = decide("if_better", 0.0, 0.3, published={"score": last})
    assert decision.outcome == publish.PROMOTED and decision.published is None
