"""Kubernetes side of a run: manifests rendered from the RunSpec, their validation, and the client that applies them."""
