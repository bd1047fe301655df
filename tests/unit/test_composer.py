"""``requirements-composer.txt``: what a Cloud Composer 3 environment adds for the package, and nothing of its own.

Composer's Airflow, its providers and their dependencies are the environment's: the file must add exactly the
distributions the package imports that none of those bring (so a new import of something else fails here), with
lower bounds only, and installing it must change no Airflow distribution. Run on the floor venv too (make test-floor),
where that Airflow is Composer's 3.1.0.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import ROOT

COMPOSER_FILE = ROOT / "requirements-composer.txt"
PACKAGE = ROOT / "plugins" / "nemo_rl_gke"
# What a Composer 3 environment has installed before any PyPI package is added: Airflow and the providers the package
# uses (its preinstalled package lists: https://cloud.google.com/composer/docs/versions-packages).
PREINSTALLED = (
    "apache-airflow",
    "apache-airflow-providers-google",
    "apache-airflow-providers-cncf-kubernetes",
    "apache-airflow-providers-http",
)


def composer_requirements() -> list[Requirement]:
    lines = [line.split("#")[0].strip() for line in COMPOSER_FILE.read_text(encoding="utf-8").splitlines()]
    return [Requirement(line) for line in lines if line]


def dependency_closure(roots: tuple[str, ...]) -> set[str]:
    """The installed distributions ``roots`` require, transitively (markers and extras evaluated), by canonical name."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(root, frozenset[str]()) for root in roots]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def imported_modules() -> set[str]:
    """Every absolute module the package's Airflow side imports (remote/ runs on the cluster, not in Composer)."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if "remote" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    top = {m.split(".")[0] for m in found}
    return {m for m in found if m.split(".")[0] in top - set(sys.stdlib_module_names) - {"airflow", "nemo_rl_gke"}}


def owning_distribution(module: str, candidates: dict[str, list[str]]) -> str | None:
    """The distribution whose files hold ``module``'s longest importable prefix with a file of its own (namespace
    packages such as ``google.cloud`` have none, and many distributions share them)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:end]))
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or spec.origin in ("namespace", "built-in", "frozen"):
            continue
        origin = Path(spec.origin).resolve()
        for name in candidates.get(parts[0], ()):
            dist = md.distribution(name)
            if any(
                Path(str(dist.locate_file(f))).resolve() == origin for f in dist.files or () if f.name == origin.name
            ):
                return canonicalize_name(name)
    return None


def imported_distributions() -> set[str]:
    candidates = md.packages_distributions()
    owners = {m: owning_distribution(m, candidates) for m in imported_modules()}
    assert None not in owners.values(), sorted(m for m, d in owners.items() if d is None)
    return {d for d in owners.values() if d}


def test_the_file_adds_exactly_what_the_package_imports_and_composer_lacks() -> None:
    needed = imported_distributions() - dependency_closure(PREINSTALLED)
    listed = {canonicalize_name(r.name) for r in composer_requirements()}
    assert listed == needed, f"missing from requirements-composer.txt: {needed - listed}; not needed: {listed - needed}"
    # The closure is real: the package's Google and Kubernetes clients come with Composer's providers.
    assert {"google-cloud-container", "kubernetes", "ray"} <= dependency_closure(PREINSTALLED)


def test_it_has_lower_bounds_only_and_nothing_of_airflow() -> None:
    for req in composer_requirements():
        assert not canonicalize_name(req.name).startswith("apache-airflow"), req
        assert req.specifier and all(s.operator in (">=", "<") for s in req.specifier), req


def test_installing_it_changes_no_airflow_distribution() -> None:
    """pip's own resolution against this environment: on the floor venv, Composer's Airflow 3.1.0."""
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "-r", str(COMPOSER_FILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    planned = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.stdout)["install"]}
    assert not [name for name in planned if canonicalize_name(name).startswith("apache-airflow")], planned
