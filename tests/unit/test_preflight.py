"""Offline preflight: every rule trips on its example with the documented message, and passes its counter-example."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from nemo_rl_gke.preflight.offline import check_conf, rules, validate
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.findings import ConfError
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec
from tests.paths import ROOT

# rule id -> a fragment of the message its example must produce. Every registered rule must be listed here.
EXPECTED_MESSAGES = {
    "deployment.project": "project 'someone-elses-proj' is outside the deployment's bound [nemo_rl_gke] allowed_proj",
    "deployment.region": "region 'europe-west4' is outside the deployment's bound [nemo_rl_gke] allowed_regions",
    "deployment.export-bucket": "bucket 'outsider-drop-box' is outside the deployment's bound [nemo_rl_gke] allowed_e",
    "deployment.gpu-nodes": "the run may hold 3 GPU nodes",
    "deployment.recoveries": "max_recoveries=6 is more than the deployment's bound [nemo_rl_gke] max_recoveries",
    "deployment.recipe": "recipe 'qwen2.5-7b-gsm8k-v0.7.0' is outside the deployment's bound [nemo_rl_gke] allowed_rec",
    "deployment.budget": "the run would last up to 100 h, more than the deployment's bound [nemo_rl_gke] max_run_hours",
    "deployment.capacity": "spot is outside the deployment's bound [nemo_rl_gke] allowed_capacity",
    "deployment.gpu-price": "a b200 GPU-hour on on_demand (11 USD) costs more than the deployment's bound",
    "name.project": "a project ID is 6-30 characters",
    "location.zone-in-region": "the zone must be a zone of region us-central1",
    "name.compute": "derived name 'RDMA_net-net' is not a valid Compute Engine name",
    "name.gke": "GKE cluster and node pool names are 1-40 characters",
    "name.lustre-instance": "a Managed Lustre instance ID is 1-63 characters",
    "lustre.filesystem": "a Lustre filesystem name is 1-8 letters and digits",
    "lustre.capacity": "at 500 MB/s/TiB the capacity must be 18,000-20,016,000 GiB and a multiple of 18,000",
    "gpu.machine-type": "gpu_type h200 (nvidia-h200-141gb x8) runs only on a3-ultragpu-8g (a4-highgpu-8g carries b200)",
    "network.cidr-valid": "is not an IPv4 network address in CIDR form",
    "network.cidr-overlap": "nemo-rl-rdma-sub-0 (192.168.1.0/24) overlaps nemo-rl-gvnic-sub (192.168.1.0/24)",
    "network.firewall-covers-subnet": "does not contain the gVNIC subnet 192.168.0.0/24",
    "gpu.replicas-vs-pool": "4 GPU workers need 4 nodes but the pool stops at 2",
    "gpu.flex-start-hours": "flex_start_max_hours=24 limits flex-start nodes, but the run's capacity is spot",
    "gpu.capacity-ladder": "the ladder starts at flex_start, but capacity is reservation",
    "gpu.flex-start-gke-version": "GKE 1.31.6-gke.1020000 has no flex-start node pools for GPUs",
    "gpu.queued-alone": "queued is on a ladder with other options: its workers wait on their ProvisioningRequest",
    "cluster.default-pool-bounds": "the default pool needs min (3) <= initial (1) <= max (5)",
    "name.kubernetes": "usable as service name Ray_Cluster-head-svc",
    "storage.checkpoint-on-lustre": "must be a normalised path below /data",
    "export.bucket-name": "is not a Cloud Storage bucket name",
    "kube.nccl-installer-source": "its source must be 'bundled', an https URL on the deployment's allowlist, or a "
    ".yaml file inside include/: the scheme is http, not https",
    "secrets.connections": "the Hugging Face token may be read only from a connection this deployment allows for it "
    "(huggingface_default)",
    "nemo.dataset-has-a-step": "the training split has 7473 examples, fewer than one batch of 8192 prompts",
    "nemo.step-budget": "even from step 0 the recipe's epoch cap ends the job first: 467 steps, not max_steps=500",
    "nemo.world-size": "generation takes 2 of 2 nodes, leaving none for training",
    "nemo.dtensor-tp-divides": "DTensor TP 16 x CP 1 = 16 does not divide the 8 training GPUs",
    "nemo.vllm-tp-divides": "vLLM TP 16 x PP 1 does not divide the 8 generation GPUs",
    "nemo.tp-divides-heads": "Qwen/Qwen2.5-7B-Instruct has 28 attention and 4 KV heads; TP 8 does not divide both",
    "nemo.batch-multiple": "12 prompts x 32 generations = 384 samples per step is not a multiple of "
    "train_global_batch_size 512",
    "nemo.batch-divisible-by-dp": "train_global_batch_size 500 is not divisible by the data-parallel size 8",
    "nemo.tp-micro-logprob": "asserts train_micro_batch_size == logprob_batch_size when TP >= 4 (TP 4, micro 1, "
    "logprob 2)",
    "nemo.override-syntax": "extra_overrides[0] is a sweep",
    "nemo.override-interpolation": "policy.optimizer.kwargs.lr gets a value with ${...}, which NeMo RL resolves in "
    "the driver",
    "nemo.override-keys": "policy.train_global_batch_size already exists in the config",
    "nemo.override-bound-key": "cluster.num_nodes is set from the conf parameter worker_replicas",
    "nemo.config-integers": "policy.train_global_batch_size is 0 in the effective config",
    "nemo.entrypoint": "entrypoint examples/run_grpo_math.py does not exist at NeMo RL v0.7.0",
    "nemo.image-version": "recipe gemma3-27b-gsm8k-v0.5.0 is pinned to NeMo RL v0.5.0",
    "nemo.v1-save-format": "checkpointing.model_save_format is 'safetensors' with policy.dtensor_cfg._v2=false",
    "eval.benchmark-in-release": "NeMo RL v0.5.0 (recipe gemma3-27b-gsm8k-v0.5.0) has no eval dataset aime2026",
    "eval.samples-need-temperature": "eval_num_tests_per_prompt=4 samples each problem, but temperature 0 is greedy",
    "eval.publish-needs-a-score": "publish=if_better compares the model's score with the last published one's",
    "eval.promoted-needs-publishing": "resume=promoted continues from the last published model, but publish=never",
    "eval.hf-export": "NeMo RL v0.5.0's convert_dcp_to_hf.py cannot read the v2 worker's torch_save layout",
    "deployment.publish": "publish=always is outside the deployment's bound [nemo_rl_gke] allowed_publish",
}
RULES = {r.rule_id: r for r in rules()}
# A deployment whose Google connection names my-project: the project these tests' confs use.
MY_PROJECT = Deployment(gcp_project="my-project")


def test_every_rule_has_a_message_test_and_enough_rules_exist() -> None:
    assert set(EXPECTED_MESSAGES) == set(RULES)
    assert sum(r.category == "resource" for r in RULES.values()) >= 10
    assert sum(r.category == "nemo-rl" for r in RULES.values()) >= 6


def _run(rule_id: str, conf: dict, recipe_patch: dict | None = None) -> list:
    spec = RunSpec.from_conf(conf)
    recipe = dataclasses.replace(load_recipe(spec.recipe), **(recipe_patch or {}))
    return list(RULES[rule_id].run(spec, recipe, Deployment(**RULES[rule_id].example_deployment)))


@pytest.mark.parametrize("rule_id", sorted(EXPECTED_MESSAGES))
def test_rule_trips_on_its_example_with_its_message(rule_id: str) -> None:
    rule = RULES[rule_id]
    findings = _run(rule_id, rule.example, rule.example_recipe)
    assert findings, f"{rule_id} did not trip on {rule.example}"
    finding = findings[0]
    assert finding.rule_id == rule_id
    assert EXPECTED_MESSAGES[rule_id] in finding.rule
    # Every finding names the parameter (one of the conf's, or one item of a list parameter), the value, the rule
    # and the fix.
    assert re.sub(r"\[\d+\]$", "", finding.param) in RunSpec.__dataclass_fields__
    assert finding.fix and finding.rule
    assert str(finding).startswith(f"[{rule_id}] {finding.param}=")


@pytest.mark.parametrize("rule_id", sorted(EXPECTED_MESSAGES))
def test_rule_passes_its_counter_example(rule_id: str) -> None:
    assert not _run(rule_id, RULES[rule_id].counter_example)


def test_tutorial_conf_is_valid() -> None:
    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    spec, findings = check_conf(conf)
    assert findings == [] and spec is not None


def test_all_problems_are_reported_at_once_and_shape_errors_are_not_echoed() -> None:
    spec, findings = check_conf(
        {
            "zone": "europe-west4-b",
            "lustre_capacity_gib": 20000,
            "dtensor_tp": "8",
            "bogus": 1,
            "num_prompts_per_step": 12,
        }
    )
    assert spec is None
    ids = [f.rule_id for f in findings]
    assert ids[:2] == ["conf.type", "conf.unknown-key"]
    assert {"location.zone-in-region", "lustre.capacity", "nemo.batch-multiple"} <= set(ids)
    # dtensor_tp had a type error: no semantic finding may blame it again.
    assert not [f for f in findings if f.rule_id.startswith("nemo.") and "dtensor_tp" in f.params]


def test_validate_raises_with_every_finding() -> None:
    with pytest.raises(ConfError) as exc:
        validate({"gpu_type": "h200", "machine_type": "a4-highgpu-8g", "lustre_filesystem": "too-long-name"})
    message = str(exc.value)
    assert message.startswith("2 problem(s) in the run conf; nothing was created:")
    assert '[gpu.machine-type] machine_type="a4-highgpu-8g"' in message
    assert '[lustre.filesystem] lustre_filesystem="too-long-name"' in message


@pytest.mark.parametrize(
    ("capacity", "throughput", "valid"),
    [
        (9000, 1000, True),
        (1_530_000, 1000, True),
        (1_539_000, 1000, False),  # above 1,530,000 the step is 72,000
        (1_584_000, 1000, True),
        (10_008_000, 1000, True),
        (10_080_000, 1000, False),
        (18000, 500, True),
        (27000, 500, False),
        (36000, 250, True),
        (72000, 125, True),
        (144000, 125, True),
        (12_312_000, 125, False),
    ],
)
def test_lustre_capacity_table(capacity: int, throughput: int, valid: bool) -> None:
    conf = {"lustre_capacity_gib": capacity, "lustre_throughput": throughput}
    assert (not _run("lustre.capacity", conf)) is valid


def test_lustre_capacity_fix_names_the_nearest_valid_sizes() -> None:
    (finding,) = _run("lustre.capacity", {"lustre_capacity_gib": 20000, "lustre_throughput": 500})
    assert finding.fix == "use 18000 or 36000 GiB, or another throughput tier"


def test_peering_range_inside_the_auto_mode_range_is_refused() -> None:
    (finding,) = _run("network.cidr-overlap", {"peering_range_address": "10.130.0.0"})
    assert "overlaps nemo-rl-net (auto mode) (10.128.0.0/9)" in finding.rule
    assert not _run("network.cidr-overlap", {"peering_range_address": "10.0.0.0"})


def test_single_node_non_colocated_split() -> None:
    ok = {"worker_replicas": 1, "gpu_pool_max_nodes": 1, "generation_gpus_per_node": 4, "dtensor_tp": 4, "vllm_tp": 4}
    assert not _run("nemo.world-size", ok)
    assert _run("nemo.world-size", {**ok, "generation_gpus_per_node": 8})


def test_override_of_a_missing_key_needs_a_plus() -> None:
    (finding,) = _run("nemo.override-keys", {"extra_overrides": ["policy.no_such_key=1"]})
    assert "policy.no_such_key does not exist in" in finding.rule and finding.fix.startswith(
        "write +policy.no_such_key"
    )
    assert not _run("nemo.override-keys", {"extra_overrides": ["+policy.no_such_key=1"]})


def test_v07_layout_refuses_v05_data_keys() -> None:
    conf = {
        "recipe": "qwen2.5-7b-gsm8k-v0.7.0",
        "dtensor_tp": 4,
        "vllm_tp": 4,
        "extra_overrides": ["data.dataset_name=x"],
    }
    (finding,) = _run("nemo.override-keys", conf)
    assert "data.dataset_name does not exist" in finding.rule


def test_interpolated_logprob_batch_follows_the_micro_batch() -> None:
    # logprob_batch_size is ${policy.train_micro_batch_size} at v0.7.0: raising the micro batch raises both.
    conf = {
        "recipe": "qwen2.5-7b-gsm8k-v0.7.0",
        "dtensor_tp": 4,
        "vllm_tp": 4,
        "extra_overrides": ["policy.train_micro_batch_size=2"],
    }
    assert not _run("nemo.tp-micro-logprob", conf)


def test_image_tag_variant_of_the_release_is_accepted() -> None:
    assert not _run("nemo.image-version", {"image_tag": "v0.5.0.nemotron_3_nano"})


@pytest.mark.parametrize(
    ("reservation", "owner", "name", "block"),
    [
        ("nemo-rl-reservation", "my-project", "nemo-rl-reservation", None),
        ("projects/shared-owner/reservations/gpus", "shared-owner", "gpus", None),
        ("gpus/reservationBlocks/block-7", "my-project", "gpus", "block-7"),
        ("projects/shared-owner/reservations/gpus/reservationBlocks/b1", "shared-owner", "gpus", "b1"),
    ],
)
def test_shared_reservations_and_reservation_blocks_are_accepted(
    reservation: str, owner: str, name: str, block: str | None
) -> None:
    spec = validate({"project": "my-project", "reservation": reservation}, MY_PROJECT)
    assert (spec.reservation_project, spec.reservation_name, spec.reservation_block) == (owner, name, block)
    # GKE takes the conf's form as the pool's reservationAffinity value, unchanged (FACTS §19).
    from nemo_rl_gke.plan.gke import node_pool_create_request
    from nemo_rl_gke.run.ownership import Owner

    request = node_pool_create_request(spec, Owner("d", "g", "r"))
    assert request.body["nodePool"]["config"]["reservationAffinity"]["values"] == [reservation]


@pytest.mark.parametrize(
    "reservation",
    [
        "projects/shared-owner/zones/us-central1-b/reservations/gpus",  # a compute URL
        "projects/shared-owner/reservations/",
        "projects/UPPER/reservations/gpus",
        "projects/x/reservations/gpus",  # project IDs have 6-30 characters
        "gpus/reservationBlocks/",
        "gpus/blocks/b1",
        "gpus/reservationBlocks/b1/extra",
        "../gpus",
        "gpus ; rm -rf /",
        "Gpus",
    ],
)
def test_a_reservation_outside_the_grammar_is_refused_naming_the_parameter(reservation: str) -> None:
    spec, findings = check_conf({"project": "my-project", "reservation": reservation}, MY_PROJECT)
    assert spec is None
    assert [f.param for f in findings] == ["reservation"], findings


def test_a_conf_above_the_deployments_budget_is_refused_naming_the_setting_and_a_lower_one_applies() -> None:
    from nemo_rl_gke.run.budget import run_budget

    deployment = Deployment(max_run_hours=10, max_run_usd=1000)
    _, findings = check_conf({"max_run_hours": 11, "max_run_usd": 2000}, deployment)
    refused = {f.param: f for f in findings if f.rule_id == "deployment.budget"}
    assert set(refused) == {"max_run_hours", "max_run_usd"}
    assert "[nemo_rl_gke] max_run_usd (AIRFLOW__NEMO_RL_GKE__MAX_RUN_USD) of 1000 USD" in refused["max_run_usd"].rule
    assert "at most 1000" in refused["max_run_usd"].fix
    local = json.loads((ROOT / "include/conf/local.json").read_text())
    spec, findings = check_conf({**local, "max_run_hours": 2}, deployment)
    assert spec is not None and not findings, findings
    # 1 node x 8 B200 at the report's 11 USD/GPU-h: 88 USD/h, so 2 h (the conf's) bind before 1000 USD.
    budget = run_budget(spec, deployment)
    assert (budget.hours, budget.usd, budget.usd_per_hour, budget.gpu_nodes) == (2.0, 176.0, 88.0, 1)
    # The USD cap, converted at those prices, binds first when it is the lower.
    spec, _ = check_conf({**local, "max_run_usd": 44}, deployment)
    assert spec is not None and run_budget(spec, deployment).hours == 0.5
    assert run_budget(spec, Deployment(max_run_hours=0, max_run_usd=0)).hours == 0.5
    spec, _ = check_conf(local, Deployment(max_run_hours=0, max_run_usd=0))
    assert spec is not None and run_budget(spec, Deployment(max_run_hours=0, max_run_usd=0)).hours is None


def test_a_conf_cannot_stretch_the_usd_budget_with_a_low_gpu_price() -> None:
    from nemo_rl_gke.run.budget import run_budget

    local = json.loads((ROOT / "include/conf/local.json").read_text())
    deployment = Deployment(max_run_hours=0, max_run_usd=88)
    cheap, _ = check_conf({**local, "gpu_hour_price_usd": 0.01}, deployment)
    dear, _ = check_conf({**local, "gpu_hour_price_usd": 22}, deployment)
    assert cheap is not None and dear is not None
    assert run_budget(cheap, deployment).hours == 1.0  # the list price, 11 USD/GPU-h x 8
    assert run_budget(dear, deployment).hours == 0.5


@pytest.mark.parametrize("name", ["a-", "-a", "1ray"])
def test_a_raycluster_name_that_is_no_object_name_is_refused_though_its_service_name_would_do(name: str) -> None:
    # "a-" gives the valid service name "a--head-svc"; the RayCluster itself would be refused by the API server.
    (finding,) = _run("name.kubernetes", {"raycluster_name": name})
    assert finding.value == name and "raycluster_name" in finding.params
