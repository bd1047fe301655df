"""Google Cloud side of a run: the REST requests of the plan, built from the RunSpec, and the actions that send them.

One module per resource family (networks, peering, lustre, gke). The request builders are pure functions of the
RunSpec: they build every body as the google-cloud message type, so a misspelt field fails in a unit test rather than
in a cloud call, and they return :class:`~nemo_rl_gke.gcp.api.ApiRequest` values that the plan prints and the
actions send. These modules import google.cloud at module level; nothing outside this package may.
"""
