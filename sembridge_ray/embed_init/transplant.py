"""Writing the initialised model: the source MLM with its vocabulary-sized tensors swapped for the
target's."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sembridge_ray.sparse.model import Serving, max_positions, save_sparse_encoder


def target_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    size: int,
    inputs: torch.Tensor,
    outputs: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> PreTrainedModel:
    """Resize ``model`` to ``size`` rows and install the target input/output embeddings and decoder
    bias.

    The special-token ids in the config follow the target tokenizer: RoBERTa derives position ids
    from ``pad_token_id``, so a stale one would silently shift every position."""
    model.resize_token_embeddings(size, mean_resizing=False)
    with torch.no_grad():
        embeddings = cast(torch.Tensor, model.get_input_embeddings().weight)
        embeddings.copy_(inputs)
        head = model.get_output_embeddings()
        if outputs is not None and head is not None and head.weight is not embeddings:
            cast(torch.Tensor, head.weight).copy_(outputs)
        if bias is not None:
            # BERT/RoBERTa tie `cls.predictions.bias`/`lm_head.bias` to the decoder's bias; update
            # every vocabulary-sized bias once, whether or not a given architecture ties them.
            seen: set[int] = set()
            for name, tensor in model.state_dict(keep_vars=True).items():
                if name.endswith("bias") and tensor.shape == (size,) and id(tensor) not in seen:
                    seen.add(id(tensor))
                    tensor.data.copy_(bias)
    for role in ("pad", "bos", "eos", "sep", "cls", "mask", "unk"):
        if hasattr(model.config, f"{role}_token_id"):
            setattr(model.config, f"{role}_token_id", getattr(tokenizer, f"{role}_token_id", None))
    if hasattr(model, "roberta"):
        model.roberta.embeddings.padding_idx = tokenizer.pad_token_id  # type: ignore[union-attr]
    model.config.vocab_size = size
    return model


def write_target_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    serving: Serving | None = None,
) -> None:
    """Save as a SparseEncoder directory with the target tokenizer, its length capped at the
    encoder's."""
    tokenizer.model_max_length = min(int(tokenizer.model_max_length), max_positions(model))
    save_sparse_encoder(model, tokenizer, out_dir, serving)
