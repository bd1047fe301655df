"""What each pinned NeMo RL release writes into ``step_N/``, per save path: the checkpoint validator's expectations.

Read from each release's own writer code (docs/model-out.md names every line):

* the v1 DTensor worker (``policy.dtensor_cfg._v2: false``) saves through ``nemo_rl/utils/native_checkpoint.py``
  ``save_checkpoint``: ``dcp.save`` of the model into ``policy/weights/`` and of the optimizer into
  ``policy/optimizer/`` (``.metadata`` and one ``__{rank}_0.distcp`` per training rank), and the tokenizer's
  ``save_pretrained`` into ``policy/tokenizer/`` (native_checkpoint.py:138-175 at v0.5.0 and v0.7.0). It refuses any
  ``checkpointing.model_save_format`` at the first save (``lm_policy.py:812-818`` at v0.5.0, ``:1079-1085`` at v0.7.0).
* the v2 worker (``_v2: true``) saves through NVIDIA Automodel's ``Checkpointer`` (``nemo_rl/utils/
  automodel_checkpoint.py`` at v0.5.0, ``nemo_rl/models/automodel/checkpoint.py:246-329`` at v0.7.0):
  ``model_save_format: safetensors`` writes ``policy/weights/model/shard-{i:05d}-model-00001-of-00001.safetensors``
  (one per rank, each holding its DTensor shards with their offsets in the header's ``DCP_SHARDING_INFO``) and
  ``policy/weights/model/.hf_metadata/{config.json, generation_config.json, fqn_to_file_index_mapping.json}``;
  ``torch_save`` writes DCP into ``policy/weights/model/``. The optimizer goes to ``policy/optimizer/optim/`` as DCP
  either way. ``checkpointing.save_consolidated: true`` (safetensors only) adds ``policy/weights/model/consolidated/``
  with Hugging Face's ``model-*-of-*.safetensors``, ``model.safetensors.index.json`` and ``config.json``, and removes
  ``.hf_metadata``. The tokenizer: v0.7.0's v2 worker saves it into ``policy/tokenizer/``
  (``dtensor_policy_worker_v2.py:1312``); v0.5.0's passes it only when no tokenizer path is given, which GRPO always
  gives (``dtensor_policy_worker_v2.py:1929``), so v0.5.0's v2 checkpoints have no tokenizer.
* ``checkpointing.save_optimizer: false`` (v0.7.0, ``nemo_rl/utils/checkpoint.py:140``) writes no optimizer.

Pure and stdlib-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DCP = "dcp"
SAFETENSORS = "safetensors"
TORCH_SAVE = "torch_save"
FORMATS = (DCP, SAFETENSORS, TORCH_SAVE)
# Automodel's model directory under policy/weights, and its optimizer directory under policy/optimizer
# (nemo_automodel/components/checkpoint/checkpointing.py: os.path.join(weights_path, "model") and "optim").
V2_MODEL_DIR = "model"
V2_OPTIM_DIR = "optim"
HF_METADATA_DIR = ".hf_metadata"
CONSOLIDATED_DIR = "consolidated"
# Releases whose v2 worker gives Automodel no tokenizer and saves none itself.
NO_V2_TOKENIZER = ("v0.5.0",)


@dataclass(frozen=True)
class CheckpointLayout:
    """Where a run's checkpoint keeps its parts: ``format`` of the weights, and which optional parts exist."""

    format: str = DCP
    consolidated: bool = False
    tokenizer: bool = True
    optimizer: bool = True

    @property
    def weights_dir(self) -> str:
        """The weights' directory under ``step_N/``."""
        return "policy/weights" if self.format == DCP else f"policy/weights/{V2_MODEL_DIR}"

    @property
    def optimizer_dir(self) -> str:
        """The optimizer's DCP directory under ``step_N/``."""
        return "policy/optimizer" if self.format == DCP else f"policy/optimizer/{V2_OPTIM_DIR}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the validator's expectation)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CheckpointLayout:
        """Rebuild from :meth:`to_dict`; None is the v1 DCP layout."""
        if not data:
            return cls()
        return cls(
            str(data.get("format", DCP)),
            bool(data.get("consolidated")),
            bool(data.get("tokenizer", True)),
            bool(data.get("optimizer", True)),
        )

    def describe(self) -> str:
        """In words: "v2 Automodel safetensors (sharded, consolidated), tokenizer, optimizer"."""
        what = {
            DCP: "v1 DTensor torch DCP",
            SAFETENSORS: "v2 Automodel sharded safetensors",
            TORCH_SAVE: "v2 Automodel torch DCP",
        }[self.format]
        parts = [what + (" + consolidated Hugging Face safetensors" if self.consolidated else "")]
        parts.append("tokenizer" if self.tokenizer else "no tokenizer")
        parts.append("optimizer" if self.optimizer else "no optimizer")
        return ", ".join(parts)


def layout_of(version: str, config: Mapping[str, Any]) -> CheckpointLayout:
    """The layout NeMo RL ``version`` writes with the effective ``config`` (dotted keys)."""
    v2 = config.get("policy.dtensor_cfg._v2") is True
    save_format = config.get("checkpointing.model_save_format")
    if not v2:
        fmt = DCP
    elif save_format == TORCH_SAVE:
        fmt = TORCH_SAVE
    else:
        fmt = SAFETENSORS  # Automodel's default, and grpo_math_1B.yaml's
    return CheckpointLayout(
        format=fmt,
        consolidated=fmt == SAFETENSORS and config.get("checkpointing.save_consolidated") is True,
        tokenizer=fmt == DCP or version not in NO_V2_TOKENIZER,
        optimizer=config.get("checkpointing.save_optimizer") is not False,
    )
