"""The whole mission on the sandbox with the local CPU recipe: train for real until it converged, validate and export
the checkpoint, publish the Asset event, tear down, report, the test tokens never leaking. Also: a stalled job whose
export fails, so teardown keeps Lustre until a later run releases it.
The runs that fail after training started are in tests/e2e/test_train_failures.py.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import (
    HF_TEST_TOKEN,
    INFRA_ONLY,
    LUSTRE_CHAIN,
    MODEL_OUT,
    WANDB_TEST_KEY,
    latest_xcom,
    run_cli,
    run_in_process,
    run_logged,
)
from tests.paths import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]
SPEC = RunSpec()


# Learns fast on one-digit sums, reaches reward 1.0 at step 6 and stays there; saves every 5 steps (seed 42). It
# saves as NeMo RL v0.7.0's default v2 worker does (Automodel's sharded safetensors): the other whole runs use v1's DCP.
CONVERGING = {
    **MODEL_OUT,
    "max_steps": 40,
    "zero_learning_steps": 3,
    "extra_overrides": [
        "data.max_number=1",
        "data.distractor_prob=0",
        "policy.optimizer.lr=0.03",
        "checkpointing.save_period=5",
        "policy.dtensor_cfg._v2=true",
        "checkpointing.model_save_format=safetensors",
    ],
}


def test_the_local_recipe_trains_until_it_converged_validates_exports_and_cleans_up(
    sandbox: SandboxProcess, env: dict[str, str]
) -> None:
    # One run for the whole mission and the convergence stop: each whole run costs a minute or more of CI. A run that
    # trains to max_steps through the real scheduler is the browser test's (tests/browser/test_ui.py).
    result = run_cli(CONVERGING, env)
    assert result.state == "success", result.output[-3000:]
    assert all(state == "success" for state in result.tasks.values()), result.tasks
    # Every resource was created, then deleted; every wait was a deferral, so no task held a worker slot meanwhile.
    xcom = latest_xcom()
    ensures = [s.task_id for s in t.gcp_resources()]
    deletes = [s.task_id for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP]
    assert {xcom[(k, t.RETURN)]["action"] for k in ensures} == {"created"}
    assert {xcom[(k, t.RETURN)]["action"] for k in deletes} == {"deleted"}
    deferred = set(re.findall(r"Pausing task as DEFERRED\..*?task_id=(\S+)", result.output))
    waits = {*ensures, *deletes, t.RAYCLUSTER, t.WAIT, t.CHECK_CHECKPOINT, t.CONVERT, t.EVALUATE, t.EXPORT}
    waits.add(t.DELETE_RAYCLUSTER)
    assert deferred == waits

    # The reward curve is in XCom, one row per step, and it rises on the fixed seed.
    steps = xcom[(t.WAIT, "steps")]
    done = len(steps)
    assert [s["step"] for s in steps] == list(range(1, done + 1)) and done < 40
    rewards = [s["avg_reward"] for s in steps]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    # The summary counts the table's steps: the job's whole log, not the trigger's view at the stop (the job trains
    # on for a step or more until the stop lands).
    summary = xcom[(t.WAIT, "summary")]
    assert summary["steps_completed"] == done and summary["last_step"] == f"{done}/40", (summary, done)

    # Every step header the trigger read before its stop reached the task log, in order, through the save it
    # stopped at (that they arrive while the job runs is proven causally, with a gated job, in
    # tests/gcp/test_rayjob.py: no timing here). The table reads the job's whole log after the stop, so it may hold a
    # step or two more that the job began before the stop landed.
    lines = [line for line in result.output.splitlines() if "[ray job]" in line and "Step " in line]
    logged = [n for n in range(1, done + 1) if any(f"Step {n}/40 " in line for line in lines)]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= 10, (logged, done)

    # Three steps at reward 1.0 after steps that learned: converged at step 8; the job ran on to its save at step
    # 10 and was stopped once a step after it began. Ray's log tail sends new lines about once a second, which is
    # several 0.1 s local steps, so the stop may land after a later save (15): the newest save is validated and
    # exported, and nothing before the first save after convergence is.
    waited = xcom[(t.WAIT, "return_value")]
    assert waited["converged_at"] == "8/40" and 10 <= waited["final_step"] < 40
    assert "converged at step 8/40" in result.output

    # That checkpoint was validated where it lives, in the v2 worker's layout (8 training ranks -> 8 sharded
    # safetensors files, 8 optimizer DCP shards), and exported.
    report = xcom[(t.CHECK_CHECKPOINT, "report")]
    step = report["step"]
    assert step >= 10 and step % 5 == 0
    assert report["valid"] and report["shards"] == {"weights": 8, "optimizer": 8}
    assert report["expect"]["layout"]["format"] == "safetensors"
    exported = xcom[(t.EXPORT, "return_value")]
    assert exported["step"] == step and exported["uri"].endswith(f"/step_{step}/")
    assert exported["uri"].startswith(f"gs://{SPEC.export_bucket_name}/nemo_rl_grpo_gke/")
    # The copy sits at the step's Lustre path under the run's prefix (so a resume can import it into /).
    local = RunSpec.from_conf(json.loads((ROOT / "include/conf/local.json").read_text()))
    assert exported["uri"].endswith(local.checkpoint_lustre_path(step) + "/")
    step_dir = Path(sandbox.state_dir) / "gcs" / exported["uri"].removeprefix("gs://")
    copied = {p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()}
    v2 = {"policy/weights/model/shard-00008-model-00001-of-00001.safetensors", "policy/optimizer/optim/.metadata"}
    hf = {"hf/config.json", "hf/model.safetensors", "hf/modeling_tiny_policy.py", "hf/tokenizer.json"}
    assert {"config.yaml", *v2, *hf} <= copied, sorted(copied)

    # The exported Hugging Face model loads with transformers and answers a problem it never saw.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(step_dir / "hf", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(step_dir / "hf")
    inputs = tokenizer(
        "Weng has 1 apples. Weng buys 0 more apples. How many apples does Weng have now?", return_tensors="pt"
    )
    answer = tokenizer.decode(model.generate(**inputs, max_new_tokens=8)[0, inputs["input_ids"].shape[1] :],
                              skip_special_tokens=True)  # fmt: skip
    assert re.fullmatch(r"[01]( [+-] [01])*", answer), answer

    # It was evaluated against the untrained base model (measured once, remembered) and published: the first
    # published model of this DAG.
    evaluated = xcom[(t.EVALUATE, "return_value")]
    assert evaluated["score"] > evaluated["baseline"] and evaluated["result"]["model"] == "hf", evaluated
    decided = xcom[(t.PUBLISH, "return_value")]
    assert decided["outcome"] == "promoted" and decided["hf_uri"] == exported["uri"] + "hf/", decided

    # The Asset event carries the URI, the step, the metrics and the shard count.
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        event = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == t.checkpoint_asset("nemo_rl_grpo_gke"))
            .order_by(AssetEvent.id.desc())
            .first()
        )
        assert event is not None
        assert event.extra["uri"] == exported["uri"] and event.extra["step"] == step
        assert event.extra["shards"] == {"weights": 8, "optimizer": 8}
        assert event.extra["metrics"]["steps_completed"] == done and event.extra["hf_uri"] == exported["uri"] + "hf/"
        published = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == t.published_asset("nemo_rl_grpo_gke"))
            .order_by(AssetEvent.id.desc())
            .first()
        )
        assert published is not None and published.extra["hf_uri"] == decided["hf_uri"]
        assert published.extra["score"] == evaluated["score"] and published.extra["uri"] == exported["uri"]

    # The report is the last task; teardown left nothing, no Ray process either.
    run_report = xcom[("report", "return_value")]
    assert run_report["checkpoint_uri"] == exported["uri"]
    said = re.search(r"converged at step 8/40: the job was stopped after saving step (\d+)", xcom[("report", "text")])
    assert said is not None and 10 <= int(said.group(1)) <= step
    assert run_report["gpu"]["came_up"] and not run_report["gpu"]["still_running"]
    after = sandbox.full_inventory()
    assert after["resources"] == [] and after["kubernetes"] == [] and after["ray_heads"] == []
    # Every Google API, Kubernetes and service-proxy call of the whole run carried a valid token the sandbox issued.
    logged = sandbox.calls()
    assert logged and {c["auth"] for c in logged} == {"valid"}, sandbox.unauthenticated_calls()[:5]
    assert {"compute", "container", "lustre", "kubernetes"} <= {c["service"] for c in logged}

    # Times in XCom are ISO-8601; no log line is over 8 KB (the job's event is a summary, not every step).
    assert datetime.fromisoformat(xcom[(t.SUBMIT, "return_value")]["submitted_at"]).tzinfo is not None
    assert datetime.fromisoformat(xcom[(t.WAIT, t.STARTED_AT)]).tzinfo is not None
    assert max(len(line.encode()) for line in result.output.splitlines()) < 8192

    # The test tokens appear nowhere: not in the task logs, not in XCom, not in rendered fields.
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel

    home = Path(os.environ["AIRFLOW_HOME"])
    # A line from the middle of the service-account key: the connection's secret, as secret as the tokens.
    key_line = sandbox.key_file()["private_key"].splitlines()[5]
    for path in (home / "logs").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert HF_TEST_TOKEN not in text and WANDB_TEST_KEY not in text, path
            assert key_line not in text, path
            assert max((len(line.encode()) for line in text.splitlines()), default=0) < 8192, path
    assert HF_TEST_TOKEN not in result.output and key_line not in result.output
    with create_session() as session:
        stored = json.dumps([XComModel.deserialize_value(x) for x in session.query(XComModel).all()], default=str)
        rendered = json.dumps([r.rendered_fields for r in session.query(RenderedTaskInstanceFields).all()], default=str)
    for secret in (HF_TEST_TOKEN, WANDB_TEST_KEY, key_line):
        assert secret not in stored and secret not in rendered


def test_a_stalled_job_is_stopped_its_last_save_validated_and_a_failed_export_keeps_lustre_until_released(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # The local trainer hangs after step 3 (silent and alive, as in an NCCL hang); step 2 is its newest save. Its
    # export then fails inside Lustre's exportData operation. One run for both: each is a whole run of its own.
    sandbox.add_fault({"method": "POST", "path": ":exportData$"}, operation="error", message="injected: export failed")
    overrides = ["checkpointing.save_period=2", "sandbox.hang_after_step=3"]
    result = run_logged(dag, {"max_steps": 20, "extra_overrides": overrides, "stall_after_s": 10}, capfd)
    assert result.state == "failed", result.output[-3000:]
    assert result.tasks[t.WAIT] == "failed" and result.tries[t.WAIT] == 1, result.tasks
    # A string, not a tuple: pytest shortens the repr of anything else, and CI's failure here needs the whole reason.
    assert result.tasks[t.CHECK_CHECKPOINT] == "success" and result.tasks[t.EXPORT] == "failed", (
        f"{result.tasks}\n{result.errors()}"
    )
    assert result.tasks[t.RUN_REPORT] == "failed"
    xcom = latest_xcom()
    stalled = xcom[(t.WAIT, t.JOB_STALLED)]
    assert stalled["final_step"] == 2 and stalled["message"].startswith("stalled at step 3/20: no new step in the log")
    assert "Last lines of the driver log:" in stalled["message"]
    assert "stalled at step 3/20" in xcom[(t.WAIT, t.ERROR)]
    assert xcom[(t.CHECK_CHECKPOINT, "report")]["step"] == 2
    assert xcom[(t.WAIT, "budget")]["stopped_at_budget"] is False
    assert "stalled at step 3/20" in xcom[("report", "text")]
    print("\n".join(line for line in result.output.splitlines() if "stalled at step" in line)[:3000])

    # The export failed: the message says where the checkpoint still is, and teardown kept Lustre and what it needs.
    assert re.search(r"still on Lustre instance nemo-rl-lustre at /nemo_rl_local/step_2", result.output)
    assert {r["kind"] for r in sandbox.inventory()} == LUSTRE_CHAIN
    # The message names the run whose checkpoint is pending. A run that only accepts its own loss keeps it; naming
    # that run releases it, and that run's teardown deletes it all.
    failed_run = re.search(r"release_checkpoint_of_run='([^']+)'", result.output)
    assert failed_run, result.output[-3000:]
    sandbox.clear_faults()
    cleanup = run_in_process(dag, {"release_checkpoint_of_run": failed_run.group(1), **INFRA_ONLY})
    assert cleanup.state == "success"
    assert sandbox.full_inventory()["resources"] == []
