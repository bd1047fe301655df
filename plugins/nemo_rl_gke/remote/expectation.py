"""What the submitted run should have produced, as the validator takes it (``--expect`` JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .layout import FORMATS

EXPECT_KEYS = ("step", "training_ranks", "config", "stopped", "layout")
LAYOUT_KEYS = ("format", "consolidated", "tokenizer", "optimizer")


class ExpectationError(ValueError):
    """The expectation (what the submitted run should have produced) is malformed."""


@dataclass(frozen=True)
class Expectation:
    """What the submitted run should have produced; every field is optional.

    ``step`` is the final step (default: the highest ``step_N``), ``training_ranks`` the number of policy
    training ranks, i.e. DCP shards per directory (default: not checked, but shards must be ranks 0..n-1), and
    ``config`` maps dotted config.yaml keys to values, e.g. ``{"policy.model_name": "google/gemma-3-27b-it",
    "grpo.max_num_steps": 20, "policy.dtensor_cfg.tensor_parallel_size": 4, "cluster.num_nodes": 2,
    "cluster.gpus_per_node": 8, "policy.generation.colocated.enabled": true}``. ``stopped`` says the job was stopped
    on purpose once ``step`` was saved (it converged): a later save the stop cut short (``tmp_step_N``, N > step)
    is what the stop left behind, noted rather than a problem. ``layout`` says how the pinned release saves with the
    run's config: ``{"format": "dcp" | "safetensors" | "torch_save", "consolidated", "tokenizer", "optimizer"}``
    (default: the v1 DTensor worker's DCP, with tokenizer and optimizer).
    """

    step: int | None = None
    training_ranks: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    stopped: bool = False
    layout: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, minimum in (("step", 0), ("training_ranks", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
                raise ExpectationError(f"{name} must be an integer >= {minimum}, not {value!r}")
        if not isinstance(self.config, Mapping) or not all(isinstance(k, str) and k for k in self.config):
            raise ExpectationError(f"config must map dotted config.yaml keys to values, not {self.config!r}")
        if not isinstance(self.stopped, bool) or (self.stopped and self.step is None):
            raise ExpectationError(f"stopped must be true or false, and true only with a step, not {self.stopped!r}")
        layout = self.layout
        if not isinstance(layout, Mapping) or not set(layout) <= set(LAYOUT_KEYS):
            raise ExpectationError(f"layout must be an object of {', '.join(LAYOUT_KEYS)}, not {layout!r}")
        if layout.get("format", FORMATS[0]) not in FORMATS:
            raise ExpectationError(f"layout.format must be one of {', '.join(FORMATS)}, not {layout.get('format')!r}")
        flags = [layout[k] for k in LAYOUT_KEYS[1:] if k in layout]
        if not all(isinstance(v, bool) for v in flags):
            raise ExpectationError(f"layout's consolidated, tokenizer and optimizer must be true or false: {layout!r}")

    @property
    def format(self) -> str:
        """The weights' format the run writes."""
        return str(self.layout.get("format", FORMATS[0]))

    def has(self, part: str) -> bool:
        """Whether the layout has the optional ``part`` (consolidated, tokenizer, optimizer)."""
        return bool(self.layout.get(part, part != "consolidated"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Expectation | None) -> Expectation:
        """Build from JSON: known keys plus any top-level dotted key, which is taken as a config key."""
        if isinstance(data, Expectation):
            return data
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ExpectationError(f"the expectation must be a JSON object, not {type(data).__name__}")
        config = dict(data.get("config") or {})
        unknown = []
        for key, value in data.items():
            if key in EXPECT_KEYS:
                continue
            if "." in key:
                config[key] = value
            else:
                unknown.append(key)
        if unknown:
            # A typo such as "training_rank" must not silently skip a check.
            raise ExpectationError(
                f"unknown expectation key(s) {', '.join(sorted(unknown))}: use {', '.join(EXPECT_KEYS)} "
                "or dotted config.yaml keys such as policy.model_name"
            )
        return cls(
            step=data.get("step"),
            training_ranks=data.get("training_ranks"),
            config=config,
            stopped=data.get("stopped", False),
            layout=data.get("layout") or {},
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, recorded in the report."""
        return {
            "step": self.step,
            "training_ranks": self.training_ranks,
            "config": dict(self.config),
            "stopped": self.stopped,
            "layout": dict(self.layout),
        }
