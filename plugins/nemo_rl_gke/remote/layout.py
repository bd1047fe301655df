"""What NeMo RL writes into a checkpoint (``nemo_rl/utils/checkpoint.py``, the v1 DTensor worker's
``native_checkpoint.py`` and the v2 worker's Automodel ``Checkpointer``): names the checks look for. The package's
``run/checkpoint_layout.py`` decides which layout a run writes; this module is shipped to the cluster alone, so it
keeps its own copy of the names (docs/model-out.md cites the source lines)."""

from __future__ import annotations

import re

# GRPOSaveState in nemo_rl/algorithms/grpo.py (v0.4.0 to v0.7.0); the metric and val_reward are optional.
TRAINING_INFO_KEYS = ("consumed_samples", "current_step", "current_epoch", "total_steps", "total_valid_tokens")
DCP_PARTS = ("weights", "optimizer")
# save_pretrained writes tokenizer_config.json plus at least one of these, depending on the tokenizer type.
VOCAB_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)

STEP_RE = re.compile(r"(?:(tmp|old)_)?step_(\d+)", re.ASCII)
SHARD_RE = re.compile(r"__(\d+)_(\d+)\.distcp", re.ASCII)

# The weights' formats (run/checkpoint_layout.py): v1 DCP, v2 Automodel sharded safetensors or v2 DCP (torch_save).
DCP = "dcp"
SAFETENSORS = "safetensors"
TORCH_SAVE = "torch_save"
FORMATS = (DCP, SAFETENSORS, TORCH_SAVE)
# Automodel: os.path.join(weights_path, "model"), os.path.join(optimizer_path, "optim"), model/.hf_metadata and
# model/consolidated (nemo_automodel/components/checkpoint/checkpointing.py at the commits v0.5.0 and v0.7.0 pin).
V2_MODEL_DIR = "model"
V2_OPTIM_DIR = "optim"
HF_METADATA_DIR = ".hf_metadata"
CONSOLIDATED_DIR = "consolidated"
# What ConsolidatedHFAddon.pre_save writes into .hf_metadata (addons.py): the HF config, the generation config when
# the model has one, and where each tensor goes in a consolidated save.
HF_METADATA_FILES = ("config.json", "fqn_to_file_index_mapping.json")
# torch.distributed.checkpoint's Hugging Face writer (_hf_utils.py, and Automodel's _backports/hf_utils.py): one
# "shard-{rank+1:05d}-model-00001-of-00001.safetensors" per rank in a sharded save, and consolidated files
# "model-{i:05d}-of-{n:05d}.safetensors" with their "model.safetensors.index.json".
SHARDED_SAFETENSORS_RE = re.compile(r"shard-(\d{5})-model-(\d{5})-of-(\d{5})\.safetensors", re.ASCII)
CONSOLIDATED_SAFETENSORS_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors", re.ASCII)
SAFETENSORS_INDEX = "model.safetensors.index.json"
# The header key holding each tensor's offsets in the full tensor (its value is JSON text), and safetensors' own.
SHARDING_INFO_KEY = "DCP_SHARDING_INFO"
SAVED_OFFSETS_KEY = "saved_offsets"
SAFETENSORS_METADATA_KEY = "__metadata__"
# Bytes per element of each safetensors dtype (the safetensors format's list).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
