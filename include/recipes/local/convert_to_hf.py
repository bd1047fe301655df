"""The local trainer's Hugging Face export: the sandbox's stand-in for NeMo RL's
``examples/converters/convert_dcp_to_hf.py`` (same arguments), for either of the trainer's layouts.

It loads the checkpoint's weights (``--dcp-ckpt-path step_N/policy/weights``: v1's DCP, or v2's ``model/`` sharded
safetensors or DCP) into the policy the step's ``config.yaml`` describes, and writes ``--hf-ckpt-path``: the model
with ``save_pretrained`` (``config.json`` naming its class, the class's file, the weights as ``model.safetensors``,
``generation_config.json``) and the tokenizer from ``step_N/policy/tokenizer`` (as v0.7.0's converter takes it from
there), so ``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`` and ``AutoTokenizer`` load it. Like
NeMo RL's, it refuses an output directory that exists. CPU only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import grpo_cpu
import torch
import yaml


def main(argv: list[str] | None = None) -> int:
    """Convert one checkpoint; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="config.yaml in the checkpoint's step directory")
    parser.add_argument("--dcp-ckpt-path", required=True, type=Path, help="the step's policy/weights")
    parser.add_argument("--hf-ckpt-path", required=True, type=Path, help="where the Hugging Face model goes")
    args = parser.parse_args(argv)
    if args.hf_ckpt_path.exists():
        print(f"error: {args.hf_ckpt_path} already exists", file=sys.stderr, flush=True)
        return 1
    try:
        settings = grpo_cpu.read_settings(yaml.safe_load(args.config.read_text()))
    except grpo_cpu.ConfigError as exc:
        print(f"error: {args.config}: {exc}", file=sys.stderr, flush=True)
        return 2
    torch.set_num_threads(1)
    tokenizer = grpo_cpu.WordTokenizer(settings.max_number)
    policy = grpo_cpu.build_policy(tokenizer, settings.hidden_size)
    grpo_cpu.load_weights(policy, args.dcp_ckpt_path)
    policy.save_pretrained(args.hf_ckpt_path)
    saved = args.dcp_ckpt_path.parent / "tokenizer"
    if saved.is_dir():
        for item in saved.iterdir():
            shutil.copy(item, args.hf_ckpt_path / item.name)
    else:
        tokenizer.save_pretrained(args.hf_ckpt_path, "local/tiny-policy")
    files = sorted(p.name for p in args.hf_ckpt_path.iterdir())
    print(f"Saved the Hugging Face model to {args.hf_ckpt_path}: {', '.join(files)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
