"""Loading and writing sentence-transformers ``SparseEncoder`` directories (MLM + SPLADE max pooling)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from sembridge_ray.errors import InputError

log = logging.getLogger(__name__)


def load_mlm(
    name: str, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an MLM and its tokenizer from a hub id or directory; failure is an :class:`InputError` naming it."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        model = AutoModelForMaskedLM.from_pretrained(name, trust_remote_code=trust_remote_code, use_safetensors=True)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load masked-LM model {name!r}: {_first_line(err)}") from None
    return model, tokenizer


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"cannot load tokenizer {name!r}: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def build_sparse_encoder(mlm_dir: Path, device: str = "cpu", **kwargs: Any) -> Any:
    """A ``SparseEncoder`` = fill-mask Transformer over ``mlm_dir`` + SpladePooling(max, log(1 + relu))."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    # SpladePooling's "relu" already applies log1p; its "log1p_relu" would apply it twice.
    pooling = SpladePooling(pooling_strategy="max", activation_function="relu")
    return SparseEncoder(modules=[Transformer(str(mlm_dir), transformer_task="fill-mask", **kwargs), pooling],
                         device=device)


def save_sparse_encoder(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Write ``out_dir`` as a SparseEncoder directory that also loads with ``AutoModelForMaskedLM``.

    ``out_dir`` should be a fresh (temporary) path; callers rename it into place (see ``outputs.atomic_path``).
    """
    if model.get_input_embeddings().weight.shape[0] != model.config.vocab_size:
        raise ValueError("config.vocab_size must equal the number of embedding rows")
    with tempfile.TemporaryDirectory(dir=Path(out_dir).parent) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        build_sparse_encoder(Path(staging)).save(str(out_dir), safe_serialization=True)


@torch.no_grad()
def mlm_embeddings(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(input embeddings (V, d), untied output embeddings (V, d) or None, decoder bias (V,) or None)."""
    inp = model.get_input_embeddings().weight
    out_layer = model.get_output_embeddings()
    out = None if out_layer is None or out_layer.weight is inp else out_layer.weight
    bias = getattr(out_layer, "bias", None) if out_layer is not None else None
    return inp, out, bias


def load_sparse_encoder(path: str, device: str = "cpu", max_length: int | None = None) -> Any:
    """Load a SparseEncoder directory (or hub id) for inference; failure names the path."""
    from sentence_transformers import SparseEncoder

    try:
        model = SparseEncoder(str(path), device=device)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load sparse encoder {path!r}: {_first_line(err)}") from None
    if max_length is not None:
        model.max_seq_length = max_length
    return model.eval()
