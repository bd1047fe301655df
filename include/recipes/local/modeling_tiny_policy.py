"""The local trainer's policy as a Hugging Face model: a GRU encoder-decoder that writes a calculation.

It reads the question and writes ``number (op number)* <eos>`` token by token (guided decoding, as vLLM can constrain
an LLM): at number positions it copies a number from the question through a pointer (attention over the question's
number tokens, as pointer-generator networks copy), at the other positions it picks ``+``, ``-`` or ``<eos>``.

It is a ``PreTrainedModel`` with ``GenerationMixin``, registered for ``AutoModelForCausalLM``: the trainer trains it,
and the Hugging Face export (``save_pretrained``) writes ``config.json`` with an ``auto_map`` to this file, which it
copies beside the safetensors weights, so ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``
loads it and ``generate`` writes its answers. As a causal LM its input is the question's tokens, then ``<bos>``
(which the exported tokenizer appends), then what it wrote so far; the logits at ``<bos>`` and after it are the
next token's.

Only torch and transformers: the file travels alone with the exported model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class TinyPolicyConfig(PretrainedConfig):
    """The vocabulary's layout and the hidden size: which ids are numbers (copied from the question) and operators."""

    model_type = "nemo_rl_gke_tiny_policy"

    def __init__(
        self,
        *,
        vocab_size: int = 64,
        hidden_size: int = 64,
        number_token_ids: list[int] | None = None,
        operator_token_ids: list[int] | None = None,
        pad_token_id: int = 0,
        bos_token_id: int = 2,
        eos_token_id: int = 3,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.number_token_ids = list(number_token_ids or [])
        self.operator_token_ids = list(operator_token_ids or [])
        # No key-value cache: every step re-reads the whole (short) sequence.
        kwargs.setdefault("use_cache", False)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)


@dataclass
class Memory:
    """What the decoder attends to for each response row: the question's tokens, number mask and encoder states."""

    ids: torch.Tensor
    numbers: torch.Tensor
    keys: torch.Tensor


class TinyPolicyForCausalLM(PreTrainedModel, GenerationMixin):
    """The policy. Training uses :meth:`encode` and :meth:`step`; Hugging Face inference uses :meth:`forward`."""

    config_class = TinyPolicyConfig
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: TinyPolicyConfig) -> None:
        super().__init__(config)
        vocab_size, hidden = config.vocab_size, config.hidden_size
        self.embed = nn.Embedding(vocab_size, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = nn.GRUCell(hidden, hidden)
        self.query = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab_size)
        # The vocabulary's masks, built on first use: from_pretrained runs __init__ on the meta device, where a tensor
        # made here would hold no values.
        self._masks: tuple[torch.Tensor, torch.Tensor] | None = None
        self.post_init()
        # No key-value cache to keep between generate's steps: each one re-reads the whole (short) sequence.
        self.generation_config.use_cache = False

    def _init_weights(self, module: nn.Module) -> None:
        """Keep PyTorch's own initialisation of each layer (what the trainer was tuned with)."""

    @property
    def masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the tokens that cannot follow a number: all but the operators and ``<eos>``, the number tokens' ids)."""
        if self._masks is None:
            config = self.config
            not_closing = torch.ones(config.vocab_size, dtype=torch.bool)
            not_closing[[*config.operator_token_ids, config.eos_token_id]] = False
            self._masks = (not_closing, torch.tensor(config.number_token_ids, dtype=torch.long))
        return self._masks

    # --- the trainer's interface ---------------------------------------------------------------------------------

    def encode(
        self, ids: torch.Tensor, lengths: torch.Tensor, numbers: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, Memory]:
        """The decoder's initial state and memory for response rows answering the right-padded questions ``ids``
        (``rows`` maps each row to its question)."""
        outputs, _ = self.encoder(self.embed(ids))
        last = outputs[torch.arange(len(outputs)), lengths - 1]
        return last[rows], Memory(ids[rows], numbers[rows], outputs[rows])

    def step(
        self, tokens: torch.Tensor, state: torch.Tensor, memory: Memory, position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the previous token; returns log-probabilities over the vocabulary for ``position`` and the new state."""
        state = self.decoder(self.embed(tokens), state)
        if position % 2:
            logits = self.lm_head(state).masked_fill(self.masks[0], float("-inf"))
            return F.log_softmax(logits, dim=-1), state
        scores = torch.einsum("blh,bh->bl", memory.keys, self.query(state)).masked_fill(~memory.numbers, float("-inf"))
        # A number that occurs twice in the question is one token: its probability is the sum over its positions.
        top = scores.max(dim=1, keepdim=True).values
        mass = torch.zeros(len(tokens), self.lm_head.out_features).scatter_add(1, memory.ids, (scores - top).exp())
        logits = torch.where(mass > 0, mass.clamp_min(1e-30).log() + top, float("-inf"))
        return F.log_softmax(logits, dim=-1), state

    # --- Hugging Face's causal-LM interface ----------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any) -> CausalLMOutput:
        """Log-probabilities of the next token at ``<bos>`` and every position after it (0 before it): each row is
        the question, ``<bos>`` (appended when missing) and the answer so far; padding is left or right."""
        batch, width = input_ids.shape
        mask = attention_mask.bool() if attention_mask is not None else input_ids.ne(self.config.pad_token_id)
        logits = torch.zeros(batch, width, self.config.vocab_size)
        for row in range(batch):
            tokens = input_ids[row][mask[row]]
            places = mask[row].nonzero().squeeze(1)
            bos = (tokens == self.config.bos_token_id).nonzero()
            split = int(bos[0]) if len(bos) else len(tokens)
            question, answer = tokens[:split], tokens[split + 1 :]
            ids = question[None] if len(question) else torch.full((1, 1), self.config.pad_token_id)
            numbers = torch.isin(ids, self.masks[1])
            state, memory = self.encode(ids, torch.tensor([ids.shape[1]]), numbers, torch.zeros(1, dtype=torch.long))
            fed = torch.cat([torch.tensor([self.config.bos_token_id]), answer])
            for position, token in enumerate(fed.tolist()):
                logprobs, state = self.step(torch.tensor([token]), state, memory, position)
                # The logits after the question alone (no <bos> yet) go at its last token: the answer starts there.
                at = split + position if len(bos) else len(tokens) - 1 + position
                if at < len(places):
                    logits[row, places[at]] = logprobs[0]
        return CausalLMOutput(logits=logits)


TinyPolicyConfig.register_for_auto_class()
TinyPolicyForCausalLM.register_for_auto_class("AutoModelForCausalLM")
