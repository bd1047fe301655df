"""NeMo RL recipes: the pinned version, image, entrypoint, base config and the overrides a RunSpec renders into.

A recipe (``include/recipes/<name>.yaml``) says *what* to train; the RunSpec says *how big and where*. Rendering
one with the other gives the Hydra overrides and the job's shell entrypoint, and the *effective config*: the base
config's merged values (``include/recipes/nemo_rl/<version>/<base>.tsv``, read from NeMo RL's source at that tag)
with the overrides applied. The NeMo RL preflight rules read that effective config, so they check what NeMo RL
will actually run, not what the conf meant.

Overrides are read and applied by Hydra and OmegaConf themselves, the way NeMo RL's driver does it (FACTS §16:
``OverridesParser.parse_overrides``, ``ConfigLoaderImpl._apply_overrides_to_config`` on a struct config, then
``OmegaConf.to_container(resolve=True)``), never by a grammar of our own. Conf strings rendered into overrides are
escaped by :func:`nemo_rl_gke.run.hydra_overrides.hydra_value` so that NeMo RL reads back exactly the conf's text:
``${...}`` never resolves and ``true``, ``null`` or ``1e3`` stay strings.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.conf_schema import RunConf, recipe_defaulted
from nemo_rl_gke.run.hydra_overrides import (
    Override,
    OverrideError,
    RecipeError,
    _hydra_message,
    _parse,
    clip,
    hydra_value,
    literal_for_omegaconf,
)
from nemo_rl_gke.run.paths import RECIPES_DIR, recipe_names

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

VERSIONS_DIR = RECIPES_DIR / "nemo_rl"
LOCAL_DIR = RECIPES_DIR / "local"
LOCAL_VERSION = "local"
# Ray authenticates the dashboard, the Jobs API and the GCS with a static token from this release on
# (docs.ray.io ray-security/token-auth: "Token authentication is available in Ray 2.52.0 or later").
RAY_TOKEN_AUTH_SINCE = (2, 52, 0)
# Keys the RunSpec owns, each with the conf parameter that sets it. Listed statically (not only read off the
# rendered overrides) so that a conditional template that renders nothing for this spec still protects its key.
CONF_KEYS = {
    "cluster.num_nodes": "worker_replicas",
    "cluster.gpus_per_node": "gpu_type",
    "checkpointing.checkpoint_dir": "checkpoint_dir",
    "grpo.max_num_steps": "max_steps",
    "grpo.num_prompts_per_step": "num_prompts_per_step",
    "grpo.num_generations_per_prompt": "num_generations_per_prompt",
    "policy.generation.colocated.enabled": "colocated",
    "policy.generation.colocated.resources.num_nodes": "generation_nodes",
    "policy.generation.colocated.resources.gpus_per_node": "generation_gpus_per_node",
    "policy.dtensor_cfg.tensor_parallel_size": "dtensor_tp",
    "policy.generation.vllm_cfg.tensor_parallel_size": "vllm_tp",
    "policy.generation.vllm_cfg.gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "logger.wandb_enabled": "wandb_enabled",
    "logger.wandb.name": "wandb_run_name",
    "logger.wandb.project": "wandb_project",
}
MODEL_KEY = "policy.model_name"
# (key, why, fix): what the DAG itself relies on besides the conf's keys. `cluster` is the whole Ray cluster
# section (the DAG provisions it), so nothing below it may be set, added or deleted.
DAG_KEYS = (
    ("cluster", "describes the Ray cluster the DAG provisions", "set worker_replicas and gpu_type instead"),
    (
        "checkpointing.enabled",
        "must stay on: the DAG validates and exports the final checkpoint",
        "remove it from extra_overrides",
    ),
    (
        "checkpointing.checkpoint_must_save_by",
        "is set by the DAG from the run's budget (max_run_hours / max_run_usd)",
        "set max_run_hours or max_run_usd instead",
    ),
    # The job runs with the HF token and the W&B key in its environment: no override may pick code or a host.
    (
        "policy.tokenizer",
        "decides what Hugging Face loads and runs (NeMo RL loads tokenizers with trust_remote_code) next to the "
        "job's secrets",
        "pick a recipe for another tokenizer",
    ),
    (
        "logger.wandb",
        "is passed to wandb.init, which would send the W&B key to any host it names",
        "set wandb_run_name and wandb_project instead",
    ),
)


@dataclass(frozen=True)
class NemoVersion:
    """Facts about one NeMo RL release that the preflight needs (``nemo_rl/<version>/version.yaml``)."""

    version: str
    ray: str
    scripts: tuple[str, ...]
    data_layout: str
    tp_accuracy_check: bool
    # hydra-core and omegaconf in the release's uv.lock: the parser the preflight uses must be the same one.
    hydra: str = ""
    omegaconf: str = ""
    # What examples/run_eval.py's data.dataset_name may be at this release (gsm8k: its test split as a file).
    eval_datasets: tuple[str, ...] = ()

    @property
    def ray_version(self) -> str:
        """The lowest Ray release the pin allows (``">=2.55.1"`` gives ``2.55.1``): what the image certainly runs,
        and what KubeRay's ``spec.rayVersion`` declares. Empty when the pin names no version."""
        match = re.search(r"\d+(?:\.\d+)+", self.ray)
        return match.group() if match else ""

    @property
    def ray_token_auth(self) -> bool:
        """Whether the pinned Ray authenticates with a token (``RAY_AUTH_MODE=token``, Ray 2.52 and later)."""
        parts = tuple(int(n) for n in self.ray_version.split(".")) if self.ray_version else ()
        return parts >= RAY_TOKEN_AUTH_SINCE


@dataclass(frozen=True)
class Entry:
    """One override of the job's command line: where it came from, its text, and what Hydra made of it.

    ``params`` are the conf parameters to blame, the first being the one to change: ``extra_overrides[i]`` for a
    user-given override, the RunSpec fields a recipe template reads, or ``recipe``.
    """

    origin: str
    params: tuple[str, ...]
    text: str
    shown: Any
    override: Override | None = None
    error: OverrideError | None = None
    reads_spec: bool = False

    @property
    def user_given(self) -> bool:
        """Whether the conf's extra_overrides holds it (as opposed to the recipe's templates)."""
        return self.origin != "recipe"


@dataclass(frozen=True)
class Protected:
    """A config key extra overrides may not set, add, delete or replace through an ancestor."""

    key: str
    why: str
    fix: str


@dataclass(frozen=True)
class ApplyFailure:
    """An override Hydra would refuse to apply to the config (``reason``: missing, exists, delete or other)."""

    index: int
    reason: str
    detail: str


@dataclass(frozen=True)
class Applied:
    """The result of applying a list of overrides to a base config, as NeMo RL's driver does."""

    config: Mapping[str, Any]
    failures: tuple[ApplyFailure, ...] = ()
    resolve_error: str = ""


@dataclass(frozen=True)
class Recipe:
    """A NeMo RL recipe: version, image, entrypoint, base config, model facts and override templates.

    ``protected`` lists config keys (each with everything below it) the recipe depends on beyond the ones the
    DAG derives (see :meth:`protected_keys`); extra overrides may not touch them.
    """

    name: str
    description: str
    nemo_rl_version: str
    image: str
    workdir: str
    launcher: tuple[str, ...]
    entrypoint: str
    base_config: str
    model: Mapping[str, Any]
    overrides: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    prepare: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    # The training split's size: a count, or the config key that holds it (a generated dataset). None: unknown.
    train_examples: int | str | None = None
    dataset: str = ""
    # Seconds from the job's submit to NeMo RL's "SETUP COMPLETE" (model load, vLLM start), reserved up front so the
    # job's deadline save falls before the run's deadline while no earlier run of the recipe has measured it.
    setup_s: float = 600.0
    # The values of the conf parameters left empty that the recipe decides (conf_schema.recipe_defaulted).
    conf_defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> NemoVersion:
        """The NeMo RL release facts this recipe is pinned to."""
        return load_version(self.nemo_rl_version)

    @property
    def base_values(self) -> dict[str, Any]:
        """Every leaf key of the merged base config with its value (before overrides)."""
        return _base_config(self.nemo_rl_version, self.base_config)[0]

    @property
    def image_tag(self) -> str:
        """The tag part of the pinned image."""
        return self.image.rsplit(":", 1)[-1] if ":" in self.image else ""

    def image_for(self, spec: RunSpec) -> str:
        """The image the RayCluster runs: the recipe's, or the same repository at the conf's image_tag."""
        return f"{self.image.rsplit(':', 1)[0]}:{spec.image_tag}" if spec.image_tag else self.image

    def accepts_tag(self, tag: str) -> bool:
        """Whether ``tag`` is the recipe's release or a variant of it (v0.5.0, v0.5.0.nemotron_3_nano, ...)."""
        return tag == self.image_tag or tag.startswith((f"{self.image_tag}.", f"{self.image_tag}-"))

    def entries(self, spec: RunSpec) -> list[Entry]:
        """Every override of the command line, rendered and parsed, refused ones included (never raises)."""
        try:
            hash(spec)
        except TypeError:  # a spec built without the schema check may hold lists: render it uncached
            return list(_render_entries.__wrapped__(self.overrides, spec))
        # Cached: every rule asks, and rendering and parsing are the same for the same templates and spec.
        return list(_render_entries(self.overrides, spec))

    def render_overrides(self, spec: RunSpec) -> list[Override]:
        """The recipe's overrides rendered for ``spec``, then the conf's extra overrides; empty renders drop out.

        Raises :class:`OverrideError` for the first override that is refused, including a user-given one with an
        interpolation or on a protected key: nothing the preflight refuses can reach the job's command line.
        """
        protected = self.protected_keys(spec)
        overrides = []
        for entry in self.entries(spec):
            if entry.error is not None:
                raise entry.error
            if not accepted(entry, protected):
                raise OverrideError(entry.text, "holds an interpolation or touches a protected key", "remove it")
            assert entry.override is not None
            overrides.append(entry.override)
        return overrides

    def apply(self, spec: RunSpec, *, extra: bool = True) -> Applied:
        """Apply the parsed overrides (the conf's extra ones only with ``extra``) to the base config.

        Refused overrides are skipped, so the other rules judge the rest on their own: unparsable ones, and
        user-given ones that hold an interpolation (resolving it here would read the Airflow worker's environment)
        or touch a protected key. Every other override is applied by Hydra on a struct OmegaConf config and the
        result resolved, so values, types and interpolations are the ones NeMo RL's driver sees. Cached: every
        preflight rule reads the same result.
        """
        entries = [e for e in self.entries(spec) if extra or not e.user_given]
        protected = self.protected_keys(spec) if extra else []
        # ApplyFailure.index is the position in `entries` ("" stands for a skipped override).
        texts = tuple(e.text if accepted(e, protected) else "" for e in entries)
        return _applied(self.nemo_rl_version, self.base_config, texts)

    def effective_config(self, spec: RunSpec) -> dict[str, Any]:
        """The base config with ``spec``'s overrides applied: what NeMo RL will run with (dotted leaf keys)."""
        return dict(self.apply(spec).config)

    def protected_keys(self, spec: RunSpec) -> list[Protected]:
        """Config keys extra overrides may not touch, most specific reason first.

        The conf's keys (:data:`CONF_KEYS`), every key a recipe template sets from the RunSpec, the model name,
        the DAG's own keys (:data:`DAG_KEYS`: the whole ``cluster`` section and ``checkpointing.enabled``) and the
        keys the recipe file declares under ``protected``.
        """
        out = [
            Protected(
                key,
                f"is set from the conf parameter {param}, so the cluster, the job and the checkpoint validator stay "
                "consistent",
                f"set {param} instead",
            )
            for key, param in CONF_KEYS.items()
        ]
        for entry in self.entries(spec):
            if not entry.user_given and entry.reads_spec and entry.override is not None:
                conf = [p for p in entry.params if p != "recipe"]
                fix = f"set {' / '.join(conf)} instead" if conf else "leave it to the DAG"
                out.append(Protected(entry.override.key, "is set by the recipe from the RunSpec", fix))
        out.append(
            Protected(
                MODEL_KEY,
                f"is the recipe's model ({self.model.get('name')}), whose heads the TP rules checked",
                "pick a recipe for another model",
            )
        )
        out += [Protected(key, why, fix) for key, why, fix in DAG_KEYS]
        out += [
            Protected(key, f"is protected by the recipe {self.name}", "use another recipe, or change the recipe file")
            for key in self.protected
        ]
        return out

    def train_example_count(self, spec: RunSpec, cfg: Mapping[str, Any]) -> int | None:
        """How many training examples one epoch has: the recipe's count, or its config key's value in ``cfg``.

        None when unknown, or when the conf's extra overrides touch a ``data.`` key the count does not come from
        (another dataset or split would make a fixed count wrong).
        """
        if isinstance(self.train_examples, str):
            value = cfg.get(self.train_examples)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
        touched = [e for e in self.entries(spec) if e.user_given and e.override and e.override.key.startswith("data.")]
        return None if touched else self.train_examples

    def command(self, spec: RunSpec) -> str:
        """The job's shell entrypoint: prepare steps, then the pinned script with its config and overrides."""
        run = [*self.launcher, self.entrypoint, "--config", self.base_config]
        run += [o.text for o in self.render_overrides(spec)]
        steps = ["set -euo pipefail", 'job_dir="$PWD"']
        if self.workdir:
            steps.append(f"cd {shlex.quote(self.workdir)}")
        steps += [_template(p).render(spec=spec).strip() for p in self.prepare]
        steps.append(" ".join(shlex.quote(part) for part in run))
        return "\n".join(steps)


def accepted(entry: Entry, protected: list[Protected]) -> bool:
    """Whether an override may reach NeMo RL: parsed, and if user-given, no interpolation and no protected key."""
    if entry.override is None:
        return False
    if not entry.user_given:
        return True
    return not entry.override.interpolations() and not any(entry.override.touches(p.key) for p in protected)


@lru_cache(maxsize=256)
def _render_entries(templates: tuple[str, ...], spec: RunSpec) -> tuple[Entry, ...]:
    out: list[Entry] = []
    for template in templates:
        fields, reads_spec = _template_reads(template, type(spec))
        params = fields or ("recipe",)
        shown: Any = getattr(spec, fields[0], template) if len(fields) == 1 else template
        try:
            text = _template(template).render(spec=spec).strip()
        except RecipeError as exc:
            error = exc if isinstance(exc, OverrideError) else OverrideError(template, str(exc), "")
            out.append(Entry("recipe", params, template, shown, error=error, reads_spec=reads_spec))
            continue
        except Exception as exc:  # a broken template is a recipe finding, not a crash
            error = OverrideError(template, f"the template does not render: {clip(str(exc))}", "fix the recipe")
            out.append(Entry("recipe", params, template, shown, error=error, reads_spec=reads_spec))
            continue
        if text:
            out.append(_entry("recipe", params, text, shown, reads_spec))
    for i, text in enumerate(spec.extra_overrides):
        param = f"extra_overrides[{i}]"
        out.append(_entry(param, (param, "extra_overrides"), text, clip(text), False))
    return tuple(out)


def _entry(origin: str, params: tuple[str, ...], text: Any, shown: Any, reads_spec: bool) -> Entry:
    if not isinstance(text, str):
        error = OverrideError(clip(text), "is not a string", "write key=value")
        return Entry(origin, params, clip(text), clip(text), error=error, reads_spec=reads_spec)
    parsed = _parse(text)
    if isinstance(parsed, OverrideError):
        return Entry(origin, params, str(text), shown, error=parsed, reads_spec=reads_spec)
    return Entry(origin, params, text, shown, override=parsed, reads_spec=reads_spec)


@cache
def _jinja() -> Any:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    env.filters["hydra"] = hydra_value
    return env


@lru_cache(maxsize=256)
def _template(source: str) -> Any:
    return _jinja().from_string(source)


@lru_cache(maxsize=256)
def _template_reads(source: str, spec_type: type[RunSpec]) -> tuple[tuple[str, ...], bool]:
    """The RunSpec fields a template reads (its conf parameters), and whether it reads the RunSpec at all."""
    from jinja2 import nodes

    tree = _jinja().parse(source)
    reads = any(n.name == "spec" for n in tree.find_all(nodes.Name))
    attrs = [n.attr for n in tree.find_all(nodes.Getattr) if isinstance(n.node, nodes.Name) and n.node.name == "spec"]
    fields = tuple(dict.fromkeys(a for a in attrs if a in spec_type.__dataclass_fields__))
    return fields, reads


@lru_cache(maxsize=512)
def _applied(version: str, base_config: str, texts: tuple[str, ...]) -> Applied:
    """Apply ``texts`` (``""`` = skipped) one by one like NeMo RL's parse_hydra_overrides, then resolve."""
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(_base_omegaconf(version, base_config))
    OmegaConf.set_struct(cfg, True)
    failures = []
    for index, text in enumerate(texts):
        if text:
            failure = _apply_one(cfg, _parse(text), index)
            if failure is not None:
                failures.append(failure)
    try:
        return Applied(_flatten(OmegaConf.to_container(cfg, resolve=True)), tuple(failures))
    except Exception as exc:  # e.g. a deleted key another key interpolates
        resolve_error = _hydra_message(exc)
    # NeMo RL would stop here; the rules still see every leaf that resolves, and none of the broken ones.
    try:
        config = _flatten(OmegaConf.to_container(cfg, resolve=False))
    except Exception:  # a value too deep to copy: the override findings say why
        config = {}
    for key, value in list(config.items()):
        if isinstance(value, str) and "${" in value:
            try:
                resolved = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
                config[key] = OmegaConf.to_container(resolved) if OmegaConf.is_config(resolved) else resolved
            except Exception:  # this leaf is the broken one
                del config[key]
    return Applied(config, tuple(failures), resolve_error)


def _apply_one(cfg: Any, parsed: Override | OverrideError, index: int) -> ApplyFailure | None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    if isinstance(parsed, OverrideError):
        return None  # reported where it was parsed
    absent = object()
    try:
        current = OmegaConf.select(cfg, parsed.key, default=absent, throw_on_missing=False)
    except Exception:  # a path through a non-container
        current = absent
    try:
        # The very function NeMo RL's parse_hydra_overrides calls (pinned hydra-core), one override at a time.
        ConfigLoaderImpl._apply_overrides_to_config([parsed.hydra], cfg)
    except Exception as exc:  # Hydra/OmegaConf errors on untrusted values
        cause = exc.__cause__ or exc
        if parsed.op == "" and current is absent:
            reason = "missing"
        elif parsed.op == "+" and current is not absent and current is not None:
            reason = "exists"
        elif parsed.op == "~" and (current is absent or current is None):
            reason = "delete"
        else:
            reason = "other"
        return ApplyFailure(index, reason, _hydra_message(cause))
    return None


@cache
def _base_omegaconf(version: str, base_config: str) -> Any:
    """The base config as NeMo RL loads it: nested, with its interpolations (``${other.key}``, ``${mul:...}``)
    re-linked, so an override of a key they read changes them as it does in NeMo RL."""
    from omegaconf import OmegaConf

    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    values, aliases = _base_config(version, base_config)
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"{base_config}: {key} is below a leaf value")
        node[leaf] = aliases[key] if key in aliases else _literal_tree(value)
    return OmegaConf.create(nested)


def _literal_tree(value: Any) -> Any:
    """Base values are resolved already: their strings must stay literal in OmegaConf."""
    if isinstance(value, str):
        return literal_for_omegaconf(value)
    if isinstance(value, Mapping):
        return {k: _literal_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal_tree(v) for v in value]
    return value


@cache
def load_version(version: str) -> NemoVersion:
    """Facts about one NeMo RL release; ``local`` is the sandbox trainer in include/recipes/local."""
    if version == LOCAL_VERSION:
        scripts = tuple(sorted(p.name for p in LOCAL_DIR.glob("*.py")))
        local = _read_yaml(LOCAL_DIR / "version.yaml")
        return NemoVersion(
            LOCAL_VERSION, str(local["ray"]), scripts, "flat", False, eval_datasets=tuple(local["eval_datasets"])
        )
    data = _read_yaml(VERSIONS_DIR / version / "version.yaml")
    return NemoVersion(
        version=str(data["version"]),
        ray=str(data["ray"]),
        scripts=tuple(data["scripts"]),
        data_layout=str(data["data_layout"]),
        tp_accuracy_check=bool(data["tp_accuracy_check"]),
        hydra=str(data.get("hydra_core") or ""),
        omegaconf=str(data.get("omegaconf") or ""),
        eval_datasets=tuple(data.get("eval_datasets") or ()),
    )


@cache
def load_recipe(name: str) -> Recipe:
    """Load ``include/recipes/<name>.yaml``; raises :class:`RecipeError` when it is missing or malformed."""
    data = _read_yaml(RECIPES_DIR / f"{name}.yaml")
    try:
        return Recipe(
            name=name,
            description=str(data["description"]).strip(),
            nemo_rl_version=str(data["nemo_rl_version"]),
            image=str(data["image"]),
            workdir=str(data.get("workdir") or ""),
            launcher=tuple(data["launcher"]),
            entrypoint=str(data["entrypoint"]),
            base_config=str(data["base_config"]),
            model=dict(data["model"]),
            overrides=tuple(data["overrides"]),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            prepare=tuple(data.get("prepare") or ()),
            files=tuple(data.get("files") or ()),
            protected=tuple(str(k) for k in data.get("protected") or ()),
            train_examples=_train_examples((data.get("dataset") or {}).get("train_examples")),
            dataset=str((data.get("dataset") or {}).get("name") or ""),
            setup_s=_setup_s(data.get("setup_s", Recipe.setup_s)),
            conf_defaults=_conf_defaults(data.get("conf_defaults") or {}),
        )
    except (KeyError, TypeError) as exc:
        raise RecipeError(f"recipe {name}: missing or malformed field {exc}") from exc


def _conf_defaults(value: Any) -> dict[str, Any]:
    """A recipe's ``conf_defaults``: values only for the parameters a recipe decides, each of the parameter's type."""
    if not isinstance(value, Mapping) or not set(value) <= set(recipe_defaulted()):
        raise TypeError(f"conf_defaults may set only {', '.join(recipe_defaulted())}, got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value.values()):
        raise TypeError(f"conf_defaults values must be positive integers, got {value!r}")
    return dict(value)


def with_recipe_defaults(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with each parameter the recipe decides that it leaves empty (missing or null) set to the recipe's
    value; unchanged when the recipe is unknown (its finding says so)."""
    out = dict(conf)
    name = conf.get("recipe", RunConf.recipe)
    try:
        defaults = load_recipe(name).conf_defaults if isinstance(name, str) and name in recipe_names() else {}
    except RecipeError:
        defaults = {}
    for param in recipe_defaulted():
        if out.get(param) is None and param in defaults:
            out[param] = defaults[param]
    return out


def _setup_s(value: Any) -> float:
    """A recipe's ``setup_s``: seconds, more than 0 and at most a day; anything else is malformed."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
        raise TypeError(f"setup_s must be a number of seconds from 1 to 86400, got {value!r}")
    return float(value)


def _train_examples(value: Any) -> int | str | None:
    """A recipe's ``dataset.train_examples``: a non-negative count or a config key; anything else is malformed."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, int) and value < 0):
        raise TypeError(f"dataset.train_examples must be a count or a config key, got {value!r}")
    return value


# A base value NeMo RL interpolates: a plain ``${other.key}`` alias or a resolver call such as
# ``${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}``.
_INTERPOLATED = re.compile(r"^\(interpolated from (?P<expression>\$\{.*\})\)$")
# The resolvers NeMo RL registers before it resolves its config: "mul" in every run_*.py at v0.5.0
# (examples/run_grpo_math.py:43), "mul", "div" and "max" in nemo_rl/utils/config.py:194-198 at v0.7.0.
RESOLVERS: dict[str, Any] = {
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": max,
}


@cache
def _base_config(version: str, base_config: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Leaf values of a base config, and the keys NeMo RL interpolates, each with its ``${...}`` expression.

    The values are read with OmegaConf's YAML loader, as NeMo RL's ``OmegaConf.load`` reads the recipe: it takes
    ``3e-07`` for a float, where plain YAML 1.1 keeps it a string."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    if version == LOCAL_VERSION:
        return _flatten(_read_yaml(LOCAL_DIR / base_config)), {}
    path = VERSIONS_DIR / version / (Path(base_config).name.removesuffix(".yaml") + ".tsv")
    if not path.is_file():
        raise RecipeError(f"no effective config for {base_config} at NeMo RL {version} ({path} is missing)")
    values: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        key, raw, *note = line.split("\t")
        # OmegaConf's loader is a SafeLoader subclass: plain data only.
        values[key] = yaml.load(raw, Loader=get_yaml_loader())
        interpolated = _INTERPOLATED.match(note[0].strip()) if note else None
        if interpolated:
            aliases[key] = interpolated["expression"]
    return values, aliases


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise RecipeError(f"{path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must hold a mapping")
    return data


def notices_of(spec: RunSpec | None) -> list[str]:
    """The notices of a valid conf's recipe (none for an invalid conf: its findings come first)."""
    if spec is None:
        return []
    try:
        return security_notices(load_recipe(spec.recipe))
    except RecipeError:
        return []


def security_notices(recipe: Recipe) -> list[str]:
    """What ``validate`` reports about a recipe without refusing it: today, a pinned Ray without token auth."""
    version = recipe.version
    if version.ray_token_auth:
        return []
    return [
        f"recipe {recipe.name} pins NeMo RL {version.version} with Ray {version.ray or 'unknown'}, which predates "
        "Ray token authentication (2.52.0): the RayCluster's dashboard, Jobs API and GCS accept anyone who reaches "
        "the head, so any pod in the cluster can run code next to the job's HF and W&B tokens. Prefer a recipe on "
        "NeMo RL v0.7.0 or later (Ray 2.55.1); see docs/security.md"
    ]
