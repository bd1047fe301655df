"""The package's layers and the one direction imports go between them, written once (``tests/unit/test_layers.py``).

A module's layer is its first folder under ``nemo_rl_gke/``; a module that sits at the top, or in ``operators/`` or
``triggers/``, is Airflow glue. Data flows one way (DESIGN.md): the conf becomes a RunSpec (``run/``); ``plan/``
builds from it every request the run will send (Google API bodies, Kubernetes manifests, Ray jobs, the Lustre
transfers) and prints them; ``preflight/`` checks the RunSpec and those requests before anything exists; the actions
(``gcp/``, ``kube/``, ``ray/``) send exactly what the plan built; ``observe/`` reads what a run did; ``decide/``
holds the run's decisions as functions of what was read; the glue reads, asks ``decide/``, acts, and wires it all
into Airflow, in its own order (:data:`GLUE_ORDER`). ``remote/`` is shipped to the cluster as is, so it imports
nothing of the package outside itself. ``airflow_compat`` holds the Airflow names that moved between the supported
versions: it imports nothing of the package, and the layers that import Airflow at module level (the actions and the
glue) read it.
"""

from __future__ import annotations

GLUE = "glue"

# Each layer's folders (or top-level modules) under nemo_rl_gke/; every other module is glue.
LAYERS: dict[str, tuple[str, ...]] = {
    "compat": ("airflow_compat",),
    "remote": ("remote",),
    "run": ("run",),
    "plan": ("plan",),
    "preflight": ("preflight",),
    "gcp": ("gcp",),
    "kube": ("kube",),
    "ray": ("ray",),
    "observe": ("observe",),
    "decide": ("decide",),
}

# The layers each layer may import besides itself; glue may import every layer. Anything else goes up (or sideways
# where no direction is agreed) and fails the test. kube reads gcp for the cluster's credentials and owner records;
# ray reaches the Ray dashboard through the cluster's API server, so it reads both.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "compat": frozenset(),
    "remote": frozenset(),
    "run": frozenset(),
    "plan": frozenset({"run"}),
    "preflight": frozenset({"run", "plan"}),
    "gcp": frozenset({"compat", "run", "plan"}),
    "kube": frozenset({"compat", "run", "plan", "gcp"}),
    "ray": frozenset({"compat", "run", "plan", "gcp", "kube"}),
    "observe": frozenset({"run"}),
    # A decision reads what the actions read (their resource types, their own safety verdicts), never sends; the
    # sweep judges a lease record's names with the conf's own checks (preflight).
    "decide": frozenset({"run", "plan", "preflight", "observe", "gcp", "kube", "ray"}),
    GLUE: frozenset(LAYERS),
}

# The glue's own order: the DAG factory builds operators, an operator defers to a trigger. A module imports only its
# own stage or a later one, and an operator imports a trigger inside the function that defers (the task's process
# loads no trigger code until it waits). Glue modules outside these folders (alerts, the sweeper, the view) are
# unstaged.
GLUE_ORDER: tuple[str, ...] = ("dag_factory", "operators", "triggers")

# What the decisions layer reads to decide, which the glue may not use to decide by itself: the actions' own safety
# verdict (a delete refuses what is not the group's; decide/teardown.py) and which rung a pool is on
# (decide/ladder.py).
DECIDED_IN_DECIDE: frozenset[str] = frozenset(
    {
        "nemo_rl_gke.gcp.resources.delete_verdict",
        "nemo_rl_gke.gcp.resources.actions.delete_verdict",
        "nemo_rl_gke.run.capacity.pool_capacity",
        "nemo_rl_gke.run.capacity.rung_index",
    }
)

# Layers that import no Airflow at module level: they run in the CLI, the plan and the cluster without it
# (a function may import Airflow's config or a hook where it reads them). remote/ imports no Airflow at all.
AIRFLOW_FREE_AT_IMPORT: frozenset[str] = frozenset({"remote", "run", "preflight", "plan", "observe", "decide"})
NO_AIRFLOW: frozenset[str] = frozenset({"remote"})


def layer_of(module: str) -> str:
    """The layer of a dotted module name under ``nemo_rl_gke``."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return next((layer for layer, folders in LAYERS.items() if top in folders), GLUE)


def glue_stage(module: str) -> int | None:
    """The position of a glue module in :data:`GLUE_ORDER` (None: not a staged glue module)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return GLUE_ORDER.index(top) if top in GLUE_ORDER else None
