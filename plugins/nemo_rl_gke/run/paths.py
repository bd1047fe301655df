"""Where the package's data files live: include/recipes, include/manifests and include/schedules."""

from __future__ import annotations

import os
from pathlib import Path

# plugins/nemo_rl_gke/run/paths.py -> project root, the layout of both this repo and an Astro/compose deployment.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
# The folder that holds the nemo_rl_gke package (plugins/): files shipped to the cluster are named from it.
PLUGINS_DIR = Path(__file__).resolve().parents[2]
INCLUDE_DIR = Path(os.environ.get("NEMO_RL_GKE_INCLUDE_DIR", PROJECT_ROOT / "include"))
RECIPES_DIR = INCLUDE_DIR / "recipes"
MANIFESTS_DIR = INCLUDE_DIR / "manifests"
# One scheduled DAG per file (nemo_rl_gke.run.schedules); the variable points elsewhere for tests or other deployments.
SCHEDULES_DIR = Path(os.environ.get("NEMO_RL_GKE_SCHEDULES_DIR", INCLUDE_DIR / "schedules"))


def recipe_names() -> list[str]:
    """Names of the recipes shipped in include/recipes (file stem), sorted."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
