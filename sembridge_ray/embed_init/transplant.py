"""The initialised model: the source's matrices read, the copied and new rows composed into the
target vocabulary's (and the decoder bias, from the new tokens' frequencies under ``bias:
frequency``), the source MLM with its vocabulary-sized tensors swapped for them, written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sembridge_ray.embed_init import plus
from sembridge_ray.embed_init.combine import NewRows, compose, compose_bias
from sembridge_ray.embed_init.vocab import Partition
from sembridge_ray.sparse.model import Serving, max_positions, mlm_embeddings, save_sparse_encoder


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


def source_matrices(
    model: PreTrainedModel,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Copies of the source's input embeddings, untied output embeddings and decoder bias (None
    where absent)."""
    e_in, e_out, bias = (
        t.detach().clone() if t is not None else None for t in mlm_embeddings(model)
    )
    assert e_in is not None  # a masked-LM always has input embeddings
    return e_in, e_out, bias


def frequency_bias(
    new: NewRows, counts: dict[int, int], bias: torch.Tensor, source_tok: PreTrainedTokenizerBase
) -> NewRows:
    """``bias: frequency``: the new tokens' decoder bias from their log-counts, on the scale of the
    source's non-special biases."""
    freqs = plus.log_frequencies(counts, new.target_ids)
    sources = torch.tensor(
        sorted(set(range(len(bias))) - set(source_tok.all_special_ids)), dtype=torch.long
    )
    return replace(new, bias=plus.frequency_bias(freqs, bias[sources]))


def composed_model(
    model: PreTrainedModel,
    target_tok: PreTrainedTokenizerBase,
    part: Partition,
    new: NewRows,
    matrices: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    bias_policy: str,
) -> PreTrainedModel:
    """The source model with the target vocabulary: copied and new rows composed into each matrix
    (and the bias)."""
    e_in, e_out, bias = matrices
    inputs_rows = compose(part, e_in, new.inputs, new.target_ids, e_in.mean(0))
    outputs = None
    if e_out is not None:
        # bridged beside the inputs whenever the source has an output matrix
        assert new.outputs is not None
        outputs = compose(part, e_out, new.outputs, new.target_ids, e_out.mean(0))
    new_bias = None if bias is None else compose_bias(part, new, bias, bias_policy)
    return target_model(model, target_tok, part.size, inputs_rows, outputs, new_bias)
