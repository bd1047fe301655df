"""The triggers' HTTP clients, imported off the event loop.

The triggerer imports a trigger's module, and builds the trigger, on the event loop every deferred task of the
deployment shares. The clients a trigger runs on (aiohttp, kubernetes_asyncio, Airflow's Google base hook) cost 1 to
3 s of CPU to import the first time, which blocked that loop for all of them; so a trigger's module names only
errors and pure logic, and loads its client module here, in a worker thread, when it first runs.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from types import ModuleType

GCP = "nemo_rl_gke.gcp.async_hooks"
KUBE = "nemo_rl_gke.kube.async_client"
RAY = "nemo_rl_gke.ray.async_hooks"


async def client_module(name: str) -> ModuleType:
    """The module ``name``, imported in a worker thread unless it is loaded already.

    A module another trigger's thread is still importing is in ``sys.modules`` half built: that one is waited for
    in a thread too (the import lock hands it over complete), never used as it is.
    """
    loaded = sys.modules.get(name)
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        return loaded
    return await asyncio.to_thread(importlib.import_module, name)
