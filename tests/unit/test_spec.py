"""RunSpec: conf shape checks, defaults, round trip and derived names."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_rl_gke.run.conf_checks import conf_findings
from nemo_rl_gke.run.conf_schema import GPU_PROFILES, spec_fields
from nemo_rl_gke.run.findings import ConfError
from nemo_rl_gke.run.spec import RunSpec, default_conf


def test_defaults_are_the_tutorial_run() -> None:
    spec = RunSpec()
    assert (spec.gpu_type, spec.effective_machine_type, spec.gpu.accelerator_type) == (
        "b200",
        "a4-highgpu-8g",
        "nvidia-b200",
    )
    assert spec.worker_replicas == spec.gpu_pool_max_nodes == 2
    assert (spec.num_prompts_per_step, spec.num_generations_per_prompt, spec.max_steps) == (16, 32, 10)
    assert (spec.colocated, spec.generation_nodes, spec.dtensor_tp, spec.vllm_tp) == (False, 1, 8, 8)
    assert (spec.lustre_capacity_gib, spec.lustre_throughput, spec.lustre_filesystem) == (18000, 500, "lustrefs")
    assert spec.ksa_name == "generic-ksa" and spec.namespace == "default"


def test_round_trip_through_conf() -> None:
    spec = RunSpec.from_conf({"gpu_type": "h200", "rdma_subnet_cidrs": [f"10.1.{n}.0/24" for n in range(8)]})
    assert RunSpec.from_conf(spec.to_conf()) == spec
    assert spec.rdma_subnet_cidrs[0] == "10.1.0.0/24" and isinstance(spec.rdma_subnet_cidrs, tuple)


def test_unknown_key_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(ConfError) as exc:
        RunSpec.from_conf({"zonee": "us-central1-b"})
    (finding,) = exc.value.findings
    assert finding.rule_id == "conf.unknown-key"
    assert finding.param == "zonee" and finding.value == "us-central1-b"
    assert "did you mean 'zone'?" in finding.fix


def test_every_shape_problem_is_reported_not_just_the_first() -> None:
    findings = conf_findings(
        {"gpu_type": "a100", "worker_replicas": "2", "vllm_gpu_memory_utilization": 0, "rdma_subnet_cidrs": ["x"]}
    )
    assert [(f.param, f.rule_id) for f in findings] == [
        ("gpu_type", "conf.enum"),
        ("worker_replicas", "conf.type"),
        ("vllm_gpu_memory_utilization", "conf.exclusiveMinimum"),
        ("rdma_subnet_cidrs", "conf.minItems"),
    ]
    assert findings[0].fix == "use one of b200, h200"
    assert "'2' is not of type 'integer'" in findings[1].rule


def test_integer_is_accepted_for_a_number_field() -> None:
    assert RunSpec.from_conf({"vllm_gpu_memory_utilization": 1}).vllm_gpu_memory_utilization == 1.0


@pytest.mark.parametrize("gpu_type", sorted(GPU_PROFILES))
def test_gpu_type_derives_machine_accelerator_count_and_tuner(gpu_type: str) -> None:
    spec = RunSpec.from_conf({"gpu_type": gpu_type})
    expected = {
        "b200": ("a4-highgpu-8g", "nvidia-b200", "tuner_config_a4.txtpb"),
        "h200": ("a3-ultragpu-8g", "nvidia-h200-141gb", "tuner_config_a3u.txtpb"),
    }[gpu_type]
    assert (spec.effective_machine_type, spec.gpu.accelerator_type) == expected[:2]
    assert spec.gpus_per_node == 8 and spec.gpu.nccl_tuner_config.endswith(expected[2])


def test_names_are_derived_from_the_spec_only() -> None:
    spec = RunSpec.from_conf(
        {"project": "proj-1", "gvnic_prefix": "g", "rdma_prefix": "r", "lustre_name": "lus", "zone": "us-central1-c"}
    )
    assert (spec.gvnic_network, spec.gvnic_subnet, spec.gvnic_firewall) == ("g-net", "g-sub", "g-internal")
    assert spec.rdma_network == "r-net" and spec.rdma_subnets == tuple(f"r-sub-{n}" for n in range(8))
    assert spec.peering_range == "lus-range" and spec.network_profile == "us-central1-c-vpc-roce"
    assert spec.lustre_volume_handle == "proj-1/us-central1-c/lus"
    assert spec.head_service == "ray-cluster-kuberay-head-svc"
    assert spec.dashboard_proxy_path == "/api/v1/namespaces/default/services/ray-cluster-kuberay-head-svc:8265/proxy"


def test_submission_id_is_stable_per_run_and_unique_across_runs() -> None:
    spec = RunSpec()
    first = spec.submission_id("nemo_rl_grpo_gke", "manual__2026-11-30T01:00:00+00:00")
    assert first == spec.submission_id("nemo_rl_grpo_gke", "manual__2026-11-30T01:00:00+00:00")
    assert first != spec.submission_id("nemo_rl_grpo_gke", "manual__2026-11-30T02:00:00+00:00")
    assert first != spec.submission_id("another_dag", "manual__2026-11-30T01:00:00+00:00")
    assert set(first) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def test_every_field_has_a_schema_title_description_and_section() -> None:
    defaults = default_conf()
    for f in spec_fields():
        schema = f.metadata["schema"]
        assert schema["title"] and schema["description"] and f.metadata["section"], f.name
        # An optional field is typed ["null", T] (the form then lets it be left empty); a null means the default.
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert kinds in ([k] for k in ("string", "integer", "number", "boolean", "array")) or (
            len(kinds) == 2 and kinds[0] == "null" and kinds[1] in {"string", "array", "number", "integer"}
        ), f.name
        assert not conf_findings({f.name: defaults[f.name]}), f"default of {f.name} breaks its own schema"


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunSpec().project = "x"  # type: ignore[misc]


def test_a_token_pasted_into_the_conf_is_refused_and_never_echoed() -> None:
    (finding,) = conf_findings({"hf_token": "hf_abcdef123456", "zone": "us-central1-b"})
    assert (finding.rule_id, finding.param, finding.value) == ("conf.secret-in-conf", "hf_token", "<redacted>")
    assert "hf_abcdef123456" not in str(finding)
    assert "hf_conn_id" in finding.fix


def test_integers_are_ints_and_numbers_finite() -> None:
    findings = conf_findings({"worker_replicas": 2.0, "max_steps": True, "poll_interval_s": float("nan")})
    assert [(f.param, f.rule_id) for f in findings] == [
        ("worker_replicas", "conf.type"),
        ("max_steps", "conf.type"),
        ("poll_interval_s", "conf.type"),
    ]
    assert "write it without a decimal point" in findings[0].rule
    assert "not a finite number" in findings[2].rule


def test_strings_are_printable_and_matched_whole() -> None:
    (newline,) = conf_findings({"image_tag": "v0.5.0\n"})
    assert newline.rule_id == "conf.printable"
    (pattern,) = conf_findings({"image_tag": "v0.5.0 x"})
    assert pattern.rule_id == "conf.pattern" and "as a whole" in pattern.fix


def test_an_array_item_problem_names_the_item_and_its_fix() -> None:
    (finding,) = conf_findings({"extra_overrides": ["ok=1", "x" * 2000]})
    assert finding.rule_id == "conf.maxLength" and finding.rule.startswith("item 1:")
    assert finding.fix.startswith("each item: give a JSON string") and "length <= 1024" in finding.fix


def test_optional_fields_may_be_null_once_their_schema_says_so() -> None:
    # Room for the trigger form's optional fields (type ["null", ...]): null is valid and means the default.
    from nemo_rl_gke.run.conf_checks import _coerce, _value_problem

    nullable = {"type": ["null", "string"], "maxLength": 128}
    assert _value_problem(nullable, None) is None
    assert _value_problem({"type": "string"}, None) is not None
    assert RunSpec(**_coerce({"image_tag": None})) == RunSpec()


def test_a_former_run_parameter_the_deployment_now_decides_is_refused_unless_empty() -> None:
    (finding,) = conf_findings({"ray_dashboard_url": "http://10.0.0.7:8265"})
    assert finding.rule_id == "conf.deployment-setting" and "10.0.0.7" not in str(finding)
    assert conf_findings({"ray_dashboard_url": ""}) == []


# What the tutorial's A4 run waits for before the RayCluster is ready (conf_schema.py's comment on kube_timeout_s): the
# GPU pool's scale-up from 0 nodes and the NeMo RL image pull on each new node, each up to about 20 minutes.
A4_SCALE_UP_S = 20 * 60
NEMO_RL_IMAGE_PULL_S = 20 * 60


def test_waiting_defaults_fit_an_a4_pool_scaling_from_zero_and_a_multi_gb_image_pull() -> None:
    spec = RunSpec()
    assert spec.kube_timeout_s >= A4_SCALE_UP_S + NEMO_RL_IMAGE_PULL_S + 10 * 60  # plus the head's setup script
    assert spec.cluster_timeout_s >= 45 * 60
    assert spec.poll_interval_s <= 30  # a minute-scale step is seen within a poll or two
    assert spec.job_timeout_s >= spec.kube_timeout_s
