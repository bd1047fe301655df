"""Google Cloud side of a run: the hooks, and the actions that send the requests :mod:`nemo_rl_gke.plan` built.

The request builders (pure functions of the RunSpec) live in the plan layer (``plan/networks.py``, ``peering``,
``lustre``, ``gke``, ``transfers``); the resources here read, create and delete with exactly those requests.
These modules import google.cloud at module level; nothing outside this package and those builders may.
"""
