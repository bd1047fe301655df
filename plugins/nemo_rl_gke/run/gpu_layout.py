"""How NeMo RL splits a run's GPUs between training and generation: a fact of the effective config, read by the
preflight rules and by the validation job's expectation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """How NeMo RL will split the GPUs, from the effective config (grpo.py setup(), lm_policy.py)."""

    colocated: bool
    num_nodes: int
    gpus_per_node: int
    train_gpus: int
    generation_gpus: int
    problem: str = ""

    @property
    def error(self) -> bool:
        """Whether NeMo RL would refuse this split at setup."""
        return bool(self.problem)


def layout(cfg: dict[str, Any]) -> Layout:
    """Training and generation GPU counts, or the reason NeMo RL would refuse the split."""
    nodes = int(cfg.get("cluster.num_nodes") or 0)
    gpn = int(cfg.get("cluster.gpus_per_node") or 0)
    if cfg.get("policy.generation.colocated.enabled", True):
        return Layout(True, nodes, gpn, nodes * gpn, nodes * gpn)
    gen_nodes = cfg.get("policy.generation.colocated.resources.num_nodes")
    gen_gpn = cfg.get("policy.generation.colocated.resources.gpus_per_node")
    if nodes == 1:
        if not gen_gpn or gen_gpn >= gpn or gen_nodes not in (None, 1):
            return Layout(
                False, nodes, gpn, 0, 0, "on one node, generation takes 1..gpus_per_node-1 GPUs and at most 1 node"
            )
        return Layout(False, nodes, gpn, gpn - gen_gpn, gen_gpn)
    if not gen_nodes or gen_gpn != gpn:
        return Layout(
            False,
            nodes,
            gpn,
            0,
            0,
            f"with {nodes} nodes, generation needs at least one whole node and its gpus_per_node "
            f"({gen_gpn}) must equal the cluster's ({gpn})",
        )
    if gen_nodes >= nodes:
        return Layout(
            False, nodes, gpn, 0, 0, f"generation takes {gen_nodes} of {nodes} nodes, leaving none for training"
        )
    return Layout(False, nodes, gpn, (nodes - gen_nodes) * gpn, gen_nodes * gpn)
