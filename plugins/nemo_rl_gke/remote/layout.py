"""What NeMo RL writes into a checkpoint (``nemo_rl/utils/checkpoint.py``): names the checks look for."""

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
