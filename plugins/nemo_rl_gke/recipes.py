"""NeMo RL recipes: the pinned version, image, entrypoint, base config and the overrides a RunSpec renders into.

A recipe (``include/recipes/<name>.yaml``) says *what* to train; the RunSpec says *how big and where*. Rendering
one with the other gives the Hydra overrides and the job's shell entrypoint, and the *effective config*: the base
config's merged values (``include/recipes/nemo_rl/<version>/<base>.tsv``, read from NeMo RL's source at that tag)
with the overrides applied. The NeMo RL preflight rules read that effective config, so they check what NeMo RL
will actually run, not what the conf meant.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.paths import RECIPES_DIR

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

VERSIONS_DIR = RECIPES_DIR / "nemo_rl"
LOCAL_DIR = RECIPES_DIR / "local"
LOCAL_VERSION = "local"
OVERRIDE = re.compile(r"^(?P<op>\+\+|\+|~)?(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)(?:=(?P<value>.*))?$", re.DOTALL)
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@+\-]*$")


class RecipeError(ValueError):
    """A recipe file is missing, malformed or refers to something that does not exist."""


@dataclass(frozen=True)
class NemoVersion:
    """Facts about one NeMo RL release that the preflight needs (``nemo_rl/<version>/version.yaml``)."""

    version: str
    ray: str
    scripts: tuple[str, ...]
    data_layout: str
    tp_accuracy_check: bool


@dataclass(frozen=True)
class Override:
    """One Hydra override: ``key=v`` sets an existing key, ``+key=v`` adds one, ``++`` either, ``~key`` deletes."""

    op: str
    key: str
    value: Any
    text: str

    @classmethod
    def parse(cls, text: str) -> Override:
        """Parse ``[+|++|~]key[=value]``; the value is typed the way Hydra would (YAML scalar)."""
        import yaml

        match = OVERRIDE.match(text.strip())
        if not match or (match["value"] is None and match["op"] != "~"):
            raise RecipeError(f"{text!r} is not a Hydra override (key=value, +key=value, ++key=value or ~key)")
        raw = match["value"]
        try:
            value = yaml.safe_load(raw) if raw not in (None, "") else raw
        except yaml.YAMLError:
            value = raw
        return cls(match["op"] or "", match["key"], value, text.strip())


@dataclass(frozen=True)
class Recipe:
    """A NeMo RL recipe: version, image, entrypoint, base config, model facts and override templates."""

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

    def render_overrides(self, spec: RunSpec) -> list[Override]:
        """The recipe's overrides rendered for ``spec``, then the conf's extra overrides; empty renders drop out."""
        env = _jinja()
        rendered = [env.from_string(t).render(spec=spec).strip() for t in self.overrides]
        return [Override.parse(text) for text in [*rendered, *spec.extra_overrides] if text]

    def effective_config(self, spec: RunSpec) -> dict[str, Any]:
        """The base config with ``spec``'s overrides applied: what NeMo RL will run with."""
        values, aliases = _base_config(self.nemo_rl_version, self.base_config)
        config = dict(values)
        overridden: set[str] = set()
        for override in self.render_overrides(spec):
            config = {k: v for k, v in config.items() if not k.startswith(override.key + ".")}
            if override.op == "~":
                config.pop(override.key, None)
            else:
                config[override.key] = override.value
            overridden.add(override.key)
        # `key: ${other}` follows `other` unless the key itself was overridden, as OmegaConf resolves it.
        for key, source in aliases.items():
            if key not in overridden and source in overridden and key in config:
                config[key] = config.get(source)
        return config

    def command(self, spec: RunSpec) -> str:
        """The job's shell entrypoint: prepare steps, then the pinned script with its config and overrides."""
        env = _jinja()
        run = [*self.launcher, self.entrypoint, "--config", self.base_config]
        run += [o.text for o in self.render_overrides(spec)]
        steps = ["set -euo pipefail", 'job_dir="$PWD"']
        if self.workdir:
            steps.append(f"cd {shlex.quote(self.workdir)}")
        steps += [env.from_string(p).render(spec=spec).strip() for p in self.prepare]
        steps.append(" ".join(shlex.quote(part) for part in run))
        return "\n".join(steps)


def hydra_value(value: Any) -> str:
    """Render a Python value as a Hydra override value (booleans lower-case, odd strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    text = str(value)
    if _SAFE_VALUE.match(text) and text:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@cache
def _jinja() -> Any:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    env.filters["hydra"] = hydra_value
    return env


@cache
def load_version(version: str) -> NemoVersion:
    """Facts about one NeMo RL release; ``local`` is the sandbox trainer in include/recipes/local."""
    if version == LOCAL_VERSION:
        scripts = tuple(sorted(p.name for p in LOCAL_DIR.glob("*.py")))
        return NemoVersion(LOCAL_VERSION, "", scripts, "flat", False)
    data = _read_yaml(VERSIONS_DIR / version / "version.yaml")
    return NemoVersion(
        version=str(data["version"]),
        ray=str(data["ray"]),
        scripts=tuple(data["scripts"]),
        data_layout=str(data["data_layout"]),
        tp_accuracy_check=bool(data["tp_accuracy_check"]),
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
        )
    except (KeyError, TypeError) as exc:
        raise RecipeError(f"recipe {name}: missing or malformed field {exc}") from exc


_ALIAS = re.compile(r"^\(interpolated from \$\{(?P<source>[A-Za-z0-9_.]+)\}\)$")


@cache
def _base_config(version: str, base_config: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Leaf values of a base config, and the keys that are plain ``${other.key}`` interpolations."""
    import yaml

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
        values[key] = yaml.safe_load(raw)
        alias = _ALIAS.match(note[0].strip()) if note else None
        if alias:
            aliases[key] = alias["source"]
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
