"""Every bound the validator reads under: far above what NeMo RL writes, low enough that a crafted checkpoint
cannot exhaust the Ray head."""

from __future__ import annotations

import os

# One broken shard can make thousands of entries wrong; past this many, a check's problems are summarised.
MAX_LISTED = 10

# Read limits in bytes: far above what NeMo RL writes, low enough that a crafted file cannot exhaust the Ray head.
# .metadata: 3,000 tensors x 64 ranks (192k chunks) pickle to about 2.3 MB, and unpickled objects take ~14x that.
MAX_METADATA_BYTES = 64 << 20
# config.yaml: NeMo RL's master config is ~20 KB, and PyYAML's pure-Python parser manages ~200 KB/s.
MAX_CONFIG_BYTES = 1 << 20
# training_info.json: a handful of numbers.
MAX_TRAINING_INFO_BYTES = 1 << 20
# tokenizer_config.json: about 1.2 MB for gemma-3 (its added tokens are listed there).
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20
# Any other recorded file (gemma-3's tokenizer.json is about 33 MB): hashed in 1 MiB blocks up to this size.
MAX_HASHED_BYTES = 1 << 30
# A safetensors file is opened only for its header, whatever its size (a 27B model's rank shard is tens of GB).
MAX_SAFETENSORS_BYTES = 1 << 44
# Names read from one directory: a DCP directory holds one shard per training rank plus .metadata.
MAX_DIR_ENTRIES = 65_536
# Files and directories walked under policy/tokenizer (save_pretrained writes a handful).
MAX_WALKED = 10_000
# YAML nodes in config.yaml once every alias is expanded (the file limit allows ~500k without aliases).
MAX_YAML_NODES = 1_000_000
# Nesting of training_info.json: GRPOSaveState is flat; deeper JSON could not be re-serialised into the report.
MAX_JSON_DEPTH = 32
# Chunk pairs compared for overlap per DCP directory: a real save needs about (chunks x TP), a crafted one n².
MAX_OVERLAP_CHECKS = 20_000_000
# Dimensions and magnitudes torch tensors can have; anything else in .metadata is malformed.
MAX_TENSOR_DIMS = 64
MAX_INT64 = (1 << 63) - 1
# Characters of a value from the checkpoint echoed in a reason.
MAX_SHOWN = 200

# Every file is opened without following a symlink in its last component (directories are walked the same way) and
# without blocking on a FIFO; fstat then says whether it is a regular file.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
BLOCK = 1 << 20
