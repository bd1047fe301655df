"""The model that comes out: the Hugging Face export and the evaluation jobs, on the run's RayCluster.

After the checkpoint validates, a Ray job converts it into ``step_N/hf`` (the model's config, its weights as
safetensors and the tokenizer) with the pinned release's own tools, chosen by the layout the release wrote
(:mod:`nemo_rl_gke.run.checkpoint_layout`):

* v1 DCP: ``examples/converters/convert_dcp_to_hf.py --config step_N/config.yaml --dcp-ckpt-path
  step_N/policy/weights --hf-ckpt-path OUT`` (both tags), which writes ``pytorch_model.bin``; ``hf_safetensors.py``
  (shipped with the job) rewrites it as ``model.safetensors``;
* v2 consolidated safetensors: ``policy/weights/model/consolidated`` is already a Hugging Face model: it is copied;
* v2 sharded safetensors: Automodel's ``tools/offline_hf_consolidation.py`` (no converter of the release reads that
  layout), on a copy of ``policy/weights/model``, because the tool moves ``.hf_metadata`` out of its input;
* v2 torch_save: v0.7.0's converter (it reads ``model/.metadata``); v0.5.0's cannot (``eval.hf-export`` refuses it).

The tokenizer comes from ``step_N/policy/tokenizer`` where the release saved one, else from the base model. The job
writes ``hf.tmp`` and renames it to ``hf`` at the end, so a retried job finds either nothing or the whole export,
and one that finds ``hf`` is done. It needs no GPU (``entrypoint_num_gpus`` is 0), and the base model's config and
tokenizer come from Hugging Face with the run's HF token, as training does.

The evaluation runs the release's ``examples/run_eval.py`` (``examples/configs/evals/eval.yaml``) on ``step_N/hf``,
or on the base model for the baseline, with the conf's benchmark and sampling settings; GSM8K's test split is the
JSONL ``gsm8k_to_jsonl.py`` writes (a ``local_math_dataset`` file). The local recipe runs its own stand-ins
(``convert_to_hf.py``, ``run_eval.py``), which print what the release's do.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.plan.ray_job import HF_TOKEN_ENV, JobRequest, SecretEnv
from nemo_rl_gke.run.checkpoint_layout import DCP, SAFETENSORS, TORCH_SAVE, layout_of
from nemo_rl_gke.run.conf_schema import EVAL_OFF
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.recipes import LOCAL_VERSION, load_recipe

if TYPE_CHECKING:
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec

HF_DIR = "hf"
# /data is the Lustre mount on GKE; the sandbox sets SANDBOX_DATA_DIR to the directory standing in for it.
MOUNT = '"${SANDBOX_DATA_DIR:-/data}"'
# Automodel's offline consolidation tool in the NeMo RL image (the release's 3rdparty/Automodel-workspace submodule).
AUTOMODEL_CONSOLIDATION = "3rdparty/Automodel-workspace/Automodel/tools/offline_hf_consolidation.py"
CONVERTER = "examples/converters/convert_dcp_to_hf.py"
EVALUATOR = "examples/run_eval.py"
EVAL_CONFIG = "examples/configs/evals/eval.yaml"
# The chain-of-thought prompt math_eval.yaml uses: answer inside \boxed{}, which the math environment grades.
EVAL_PROMPT = "examples/prompts/cot.txt"
SCRIPTS = ("scripts/gsm8k_to_jsonl.py", "scripts/hf_safetensors.py")
LOCAL_FILES = ("local/grpo_cpu.py", "local/modeling_tiny_policy.py")
LOCAL_CONVERT_FILES = (*LOCAL_FILES, "local/convert_to_hf.py")
LOCAL_EVAL_FILES = (*LOCAL_FILES, "local/run_eval.py", "local/eval.yaml")
# The local base model's name (the recipe's policy.model_name): the untrained policy the trainer starts from.
LOCAL_BASE = "local/tiny-policy"


def step_dir(spec: RunSpec, step: int | str) -> str:
    """``step_N`` of the run's checkpoint as a shell word in the pod (the sandbox's stand-in for /data included)."""
    rest = spec.checkpoint_dir.removeprefix("/data")
    return f"{MOUNT}{shlex.quote(f'{rest}/step_{step}')}"


def hf_path(spec: RunSpec, step: int | str) -> str:
    """Where the Hugging Face export of ``step`` lives in the pods."""
    return f"{spec.checkpoint_dir}/step_{step}/{HF_DIR}"


def _metadata(dag_id: str, run_id: str, purpose: str, recipe: Recipe) -> dict[str, str]:
    return {"airflow_dag_id": dag_id, "airflow_run_id": run_id, "purpose": purpose, "recipe": recipe.name}


def _secrets(spec: RunSpec, deployment: Deployment | None) -> tuple[SecretEnv, ...]:
    """The HF token: the base model's config and tokenizer (a gated model's too) come from Hugging Face."""
    return (SecretEnv(HF_TOKEN_ENV, (deployment or Deployment()).hf_conn_id(spec.hf_conn_id)),)


def conversion_job(
    spec: RunSpec,
    dag_id: str,
    run_id: str,
    training_submission_id: str,
    *,
    step: int | str,
    deployment: Deployment | None = None,
) -> JobRequest:
    """The Hugging Face export of ``step``: exactly once per run (its id is the training job's plus ``-hf``)."""
    recipe = load_recipe(spec.recipe)
    step_path = step_dir(spec, step)
    lines = ["set -euo pipefail", 'job_dir="$PWD"', f"step={step_path}"]
    lines.append(f'if [ -d "$step/{HF_DIR}" ]; then echo "$step/{HF_DIR} exists: the export is done"; exit 0; fi')
    lines.append(f'rm -rf "$step/{HF_DIR}.tmp"')
    out = f'"$step/{HF_DIR}.tmp"'
    if recipe.nemo_rl_version == LOCAL_VERSION:
        lines.append(
            f'python convert_to_hf.py --config "$step/config.yaml" --dcp-ckpt-path "$step/policy/weights" '
            f"--hf-ckpt-path {out}"
        )
        files: tuple[str, ...] = LOCAL_CONVERT_FILES
    else:
        lines += _release_conversion(spec, recipe, out)
        files = SCRIPTS
    lines.append(f'mv {out} "$step/{HF_DIR}"')
    lines.append(f'echo "nemo-rl-gke: Hugging Face model at $step/{HF_DIR}"; ls "$step/{HF_DIR}"')
    return JobRequest(
        submission_id=f"{training_submission_id}-hf",
        entrypoint="\n".join(lines),
        env_vars=dict(recipe.env),
        secrets=_secrets(spec, deployment),
        working_dir_files=files,
        metadata=_metadata(dag_id, run_id, "hf-export", recipe),
    )


def _release_conversion(spec: RunSpec, recipe: Recipe, out: str) -> list[str]:
    """The pinned release's tools for its layout, run from its source tree in the image."""
    layout = layout_of(recipe.nemo_rl_version, recipe.effective_config(spec))
    model = shlex.quote(str(recipe.model["name"]))
    run = " ".join(shlex.quote(part) for part in recipe.launcher)
    lines = [f"cd {shlex.quote(recipe.workdir)}"] if recipe.workdir else []
    if layout.format in (DCP, TORCH_SAVE):
        lines.append(
            f'{run} {CONVERTER} --config "$step/config.yaml" --dcp-ckpt-path "$step/policy/weights" '
            f"--hf-ckpt-path {out}"
        )
        lines.append(f'{run} "$job_dir/hf_safetensors.py" {out}')
    elif layout.consolidated:
        lines.append(f'cp -r "$step/policy/weights/model/consolidated" {out}')
    else:
        lines.append("work=$(mktemp -d); trap 'rm -rf \"$work\"' EXIT")
        lines.append('cp -r "$step/policy/weights/model" "$work/model"')
        lines.append(
            f'{run} {AUTOMODEL_CONSOLIDATION} --model-name {model} --input-dir "$work/model" --output-dir {out}'
        )
    if layout.format == SAFETENSORS:
        # The consolidation writes no tokenizer: the release's own (v0.7.0), else the base model's.
        if layout.tokenizer:
            lines.append(f'cp -r "$step/policy/tokenizer/." {out}/')
        else:
            lines.append(
                f"{run} -c " + shlex.quote(
                    "import sys; from transformers import AutoTokenizer; "
                    "AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])"
                ) + f" {model} {out}"
            )  # fmt: skip
    return lines


def evaluation_job(
    spec: RunSpec,
    dag_id: str,
    run_id: str,
    training_submission_id: str,
    *,
    step: int | str | None,
    deployment: Deployment | None = None,
) -> JobRequest:
    """The evaluation of ``step``'s Hugging Face export, or with ``step`` None of the base model (the baseline), with
    the conf's benchmark and sampling settings (``-eval`` and ``-eval-base`` after the training job's id)."""
    if spec.eval_benchmark == EVAL_OFF:
        raise ValueError("the run's eval_benchmark is off: no evaluation job")
    recipe = load_recipe(spec.recipe)
    config = recipe.effective_config(spec)
    model = f'"$step/{HF_DIR}"' if step is not None else shlex.quote(str(recipe.model["name"]))
    lines = ["set -euo pipefail", 'job_dir="$PWD"']
    if step is not None:
        lines.append(f"step={step_dir(spec, step)}")
    settings = [
        f"eval.num_tests_per_prompt={spec.eval_num_tests_per_prompt}",
        f"generation.temperature={spec.eval_temperature:g}",
        f"generation.vllm_cfg.max_model_len={spec.eval_max_tokens}",
    ]
    if recipe.nemo_rl_version == LOCAL_VERSION:
        local = [
            f"generation.init_seed={config.get('grpo.seed', 42)}",
            f"generation.hidden_size={config.get('policy.hidden_size', 64)}",
            f"data.max_number={config.get('data.max_number', 10)}",
            f"data.distractor_prob={config.get('data.distractor_prob', 0.25)}",
            f"data.train_seed={config.get('grpo.seed', 42)}",
            f"data.num_train_samples={config.get('data.num_train_samples', 1024)}",
        ]
        words = ["python", "run_eval.py", "--config", "eval.yaml", *(shlex.quote(w) for w in settings + local)]
        lines.append(" ".join(words) + f" generation.model_name={model}")
        files: tuple[str, ...] = LOCAL_EVAL_FILES
    else:
        lines += _release_evaluation(spec, recipe, model, settings)
        files = SCRIPTS
    suffix = "-eval" if step is not None else "-eval-base"
    return JobRequest(
        submission_id=f"{training_submission_id}{suffix}",
        entrypoint="\n".join(lines),
        env_vars=dict(recipe.env),
        secrets=_secrets(spec, deployment),
        working_dir_files=files,
        metadata=_metadata(dag_id, run_id, "evaluate" if step is not None else "evaluate-base", recipe),
    )


def _release_evaluation(spec: RunSpec, recipe: Recipe, model: str, settings: list[str]) -> list[str]:
    """The release's run_eval.py on one node's GPUs (vLLM at the run's TP), GSM8K's test split written first."""
    run = " ".join(shlex.quote(part) for part in recipe.launcher)
    lines = [f"cd {shlex.quote(recipe.workdir)}"] if recipe.workdir else []
    data = [f"data.dataset_name={shlex.quote(spec.eval_benchmark)}"]
    if spec.eval_benchmark == "gsm8k":
        out = f"{spec.dataset_dir}/gsm8k_main"
        lines.append(f'{run} "$job_dir/gsm8k_to_jsonl.py" --subset main --out {shlex.quote(out)}')
        data = [
            f"data.dataset_name={shlex.quote(out + '/test.jsonl')}",
            "data.file_format=json",
            "data.split=train",
            "data.problem_key=question",
            "data.solution_key=answer",
        ]
    cluster = [
        "cluster.num_nodes=1",
        f"cluster.gpus_per_node={spec.gpus_per_node}",
        f"generation.vllm_cfg.tensor_parallel_size={spec.vllm_tp}",
        f"data.prompt_file={EVAL_PROMPT}",
        "eval.metric=pass@k",
        "eval.k_value=1",
    ]
    words = [run, EVALUATOR, "--config", EVAL_CONFIG, f"generation.model_name={model}", f"tokenizer.name={model}"]
    lines.append(" ".join([*words, *data, *(shlex.quote(w) for w in settings + cluster)]))
    return lines


def baseline_key(spec: RunSpec) -> dict[str, Any]:
    """What makes a base-model score reusable: the release, the model, the benchmark and the sampling settings."""
    recipe = load_recipe(spec.recipe)
    model = str(recipe.model["name"])
    if recipe.nemo_rl_version == LOCAL_VERSION:
        # The local base model is the untrained policy: its seed and size make it.
        config = recipe.effective_config(spec)
        model += f"@seed{config.get('grpo.seed')},hidden{config.get('policy.hidden_size')}"
    return {
        "nemo_rl_version": recipe.nemo_rl_version,
        "model": model,
        "benchmark": spec.eval_benchmark,
        "num_tests_per_prompt": spec.eval_num_tests_per_prompt,
        "max_tokens": spec.eval_max_tokens,
        "temperature": spec.eval_temperature,
    }
