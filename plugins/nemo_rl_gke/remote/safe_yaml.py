"""PyYAML's SafeLoader with a bound on alias expansion, for config.yaml."""

from __future__ import annotations

from typing import Any

import yaml

from .limits import MAX_YAML_NODES


class YamlAliasError(yaml.YAMLError):
    """config.yaml's aliases expand it past MAX_YAML_NODES nodes, or an alias refers to a node that contains it."""


class BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (plain data, no Python tags) that sizes each node as if its aliases were expanded.

    A billion-laughs file is a few hundred bytes of aliases to aliases: it is refused while it is composed, as soon
    as one node would expand past MAX_YAML_NODES, before anything walks (or prints) the expanded data.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose as PyYAML does, then record the node's expanded size (aliases count in full)."""
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # its anchor is still being composed: a node containing itself
                raise YamlAliasError("config.yaml has a recursive alias (a node that contains an alias to itself)")
            return node
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_YAML_NODES:
            raise YamlAliasError(
                f"config.yaml's aliases expand it past {MAX_YAML_NODES:,} nodes (a YAML alias bomb); "
                "yaml.safe_dump of a NeMo RL config comes nowhere near that"
            )
        self._sizes[id(node)] = size
        return node
