"""Rewrite a converted Hugging Face model's ``pytorch_model.bin`` as ``model.safetensors``; runs in the NeMo RL image.

NeMo RL's ``convert_dcp_to_hf.py`` writes one ``pytorch_model.bin`` (``torch.save`` of the state dict,
``nemo_rl/utils/native_checkpoint.py`` ``convert_dcp_to_hf``); serving stacks (vLLM, Vertex AI) and
``from_pretrained`` prefer safetensors, which also hold no pickle. The file is read with ``weights_only=True`` and
memory-mapped; tensors that share storage (tied embeddings) are written once, as ``save_pretrained`` does.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    """Convert ``DIR/pytorch_model.bin`` into ``DIR/model.safetensors`` and remove the .bin."""
    import torch
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    source = args.directory / "pytorch_model.bin"
    if not source.is_file():
        print(f"{source} is not there: nothing to rewrite")
        return
    state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    kept, seen = {}, set()
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue  # a tied copy: the model's config re-ties it on load
        seen.add(key)
        kept[name] = tensor.contiguous()
    target = args.directory / "model.safetensors"
    save_file(kept, str(target), metadata={"format": "pt"})
    source.unlink()
    print(f"wrote {len(kept)} tensors to {target} ({len(state) - len(kept)} tied ones left out)")


if __name__ == "__main__":
    main()
