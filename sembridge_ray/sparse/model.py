"""Loading and writing sentence-transformers ``SparseEncoder`` directories (MLM + SPLADE max
pooling)."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sembridge_ray.runtime.errors import InputError
from sembridge_ray.sparse.pooling import (
    Head,
    slice_tokens,
    splade_max_pool,
    splade_pool,
    splade_pool_chunked,
)

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder

log = logging.getLogger(__name__)


def load_mlm(
    name: str, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an MLM and its tokenizer from a hub id, directory or bundled name; failure is an
    :class:`InputError` naming it."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        model, info = AutoModelForMaskedLM.from_pretrained(
            name,
            trust_remote_code=trust_remote_code,
            use_safetensors=True,
            output_loading_info=True,
        )
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load masked-LM model {name!r}: {_first_line(err)}") from None
    head = mlm_head_name(model)
    fresh = [
        k for k in info.get("missing_keys", ()) if head is not None and k.startswith(head + ".")
    ]
    # transformers would initialise the head at random (its warning is among the quietened ones)
    if fresh:
        found = ", ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
        raise InputError(
            f"model {name!r} is not a sparse encoder: its weights ({found}) hold no masked-LM head "
            f"({len(fresh)} {head}.* tensors missing, e.g. {sorted(fresh)[0]})"
        )
    return model, tokenizer


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as err:
        why, path = _first_line(err), Path(name) / "tokenizer.json"
        if path.is_file():  # the tokenizers library says why; transformers names one missing key
            from tokenizers import Tokenizer

            try:
                Tokenizer.from_file(str(path))
            except Exception as bad:  # the Rust library raises plain Exceptions
                why = f"{path.name} is not a tokenizer file (the tokenizers library: {_first_line(bad)})"
        raise InputError(f"cannot load tokenizer {name!r}: {why}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    if isinstance(err, KeyError) and text:
        return f"missing key {text[0]}"
    return text[0] if text else type(err).__name__


MAX_RELU = {"pooling_strategy": "max", "activation_function": "relu"}
"""SPLADE's pooling: max over tokens of log(1 + relu) (sentence-transformers' "relu" already applies
the log)."""


@dataclass(frozen=True, kw_only=True)
class Serving:
    """How a written SparseEncoder directory encodes when loaded: the lengths the project scores it
    with (``document_length`` is also its ``max_seq_length``) and its SPLADE pooling settings."""

    query_length: int | None = None
    document_length: int | None = None
    pooling: dict[str, str] = field(default_factory=lambda: dict(MAX_RELU))


def read_pooling(model_dir: str | Path) -> dict[str, str]:
    """The SpladePooling settings (strategy, activation) of a SparseEncoder directory; SPLADE's
    max/relu for a plain masked-LM directory, a hub id or a layout without one."""
    path = Path(model_dir)
    for module in _modules(path):
        if str(module.get("type", "")).endswith("SpladePooling"):
            file = path / str(module.get("path", "")) / "config.json"
            try:
                config = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                break
            return {k: str(config.get(k, v)) for k, v in MAX_RELU.items()}
    return dict(MAX_RELU)


def save_sparse_encoder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    serving: Serving | None = None,
) -> None:
    """Write ``out_dir`` as a SparseEncoder directory that also loads with ``AutoModelForMaskedLM``:
    a fill-mask Transformer + SpladePooling (``serving.pooling``) whose dimension is the
    vocabulary's from the start.

    ``serving`` sets what ``SparseEncoder(out_dir)`` encodes with: queries and documents at its
    lengths; its ``document_length`` also becomes the tokenizer's ``model_max_length``
    (sentence-transformers' ``max_seq_length``), capped at the encoder's positions. ``out_dir``
    should be a fresh (temporary) path; callers rename it into place (see ``outputs.atomic_path``)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    if cast(torch.Tensor, model.get_input_embeddings().weight).shape[0] != model.config.vocab_size:
        raise ValueError("config.vocab_size must equal the number of embedding rows")
    serving = serving or Serving()
    if serving.document_length is not None:
        tokenizer.model_max_length = min(serving.document_length, max_positions(model))
    with tempfile.TemporaryDirectory(dir=Path(out_dir).parent) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        transformer = Transformer(
            staging,
            transformer_task="fill-mask",
            query_length=serving.query_length,
            document_length=serving.document_length,
        )
        vocab = int(transformer.auto_model.config.vocab_size)
        pooling = SpladePooling(**serving.pooling, embedding_dimension=vocab)  # type: ignore[arg-type]
        encoder = SparseEncoder(modules=[transformer, pooling], device="cpu")
        encoder.save(str(out_dir), safe_serialization=True)


def max_positions(model: PreTrainedModel) -> int:
    """Usable sequence length of the encoder (RoBERTa reserves padding_idx + 1 positions)."""
    positions = getattr(model.config, "max_position_embeddings", 512)
    roberta = getattr(model.config, "model_type", "") in ("roberta", "xlm-roberta")
    return positions - 2 if roberta else positions


def check_push(repo_id: str) -> None:
    """Refuse, before any work, a ``--push-to-hub`` that cannot succeed: a malformed repository id,
    offline mode, no token. One :class:`InputError` line each; whether the token may write there is
    the hub's answer, at the end."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise InputError(
            f"--push-to-hub {repo_id!r} is not a hub repository id (org/name): {_first_line(err)}"
        ) from None
    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"--push-to-hub {repo_id!r}: HF_HUB_OFFLINE is set; publishing needs the hub (unset it)"
        )
    if not get_token():
        raise InputError(
            f"--push-to-hub {repo_id!r}: no Hugging Face token (set HF_TOKEN or run `hf auth login`)"
        )


def push_model(model_dir: Path, repo_id: str) -> str:
    """Upload a SparseEncoder directory, its model card included, with sentence-transformers' own
    ``push_to_hub``; no hub (offline, no token, no network) is one :class:`InputError` naming the
    repository."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"cannot push to the hub repository {repo_id!r}: HF_HUB_OFFLINE is set (offline)"
        )
    try:
        url = load_sparse_encoder(str(model_dir)).push_to_hub(
            repo_id, local_model_path=str(model_dir), exist_ok=True
        )
    except Exception as err:  # the hub client raises many types; all mean "the push did not happen"
        raise InputError(
            f"cannot push to the hub repository {repo_id!r}: {_first_line(err)}"
        ) from None
    log.info("pushed %s to %s", model_dir, url)
    return str(url)


@torch.no_grad()
def mlm_embeddings(
    model: PreTrainedModel,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(input embeddings (V, d), untied output embeddings (V, d) or None, decoder bias (V,) or
    None)."""
    inp = cast(torch.Tensor, model.get_input_embeddings().weight)
    out_layer = model.get_output_embeddings()  # None, or a layer with a weight (and a bias)
    weight = getattr(out_layer, "weight", None)
    out = None if weight is None or weight is inp else cast(torch.Tensor, weight)
    return inp, out, getattr(out_layer, "bias", None)


def load_sparse_encoder(
    path: str, device: str = "cpu", max_length: int | None = None, trust_remote_code: bool = False
) -> SparseEncoder:
    """Load a SparseEncoder directory (or hub id) for inference; failure names the path."""
    from sentence_transformers import SparseEncoder

    try:
        model = SparseEncoder(str(path), device=device, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load sparse encoder {path!r}: {_first_line(err)}") from None
    if max_length is not None:
        set_max_length(model, max_length)
    return model.eval()


def set_max_length(model: SparseEncoder, max_length: int) -> None:
    """Make ``model`` encode either side at ``max_length`` tokens, whatever its own settings (an
    encoder of one side at a time: evaluation's query and document pools, or the development
    evaluation between the two)."""
    model.max_seq_length = max_length
    for module in model:
        for name in ("query_length", "document_length"):
            if getattr(module, name, None) is not None:
                setattr(module, name, max_length)


# Masked-LM classes whose head is one module mapping hidden states (B, T, H) to logits (B, T, V).
_HEAD_ATTRS = ("cls", "lm_head")
_ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def mlm_head_name(mlm: PreTrainedModel) -> str | None:
    """The attribute holding the module that maps hidden states to vocabulary logits (BERT ``cls``,
    RoBERTa/XLM-R ``lm_head``), or None for an architecture without one (such a model is pooled over
    its full logits)."""
    return next(
        (n for n in _HEAD_ATTRS if isinstance(getattr(mlm, n, None), torch.nn.Module)), None
    )


def split_head(head: torch.nn.Module) -> tuple[Head, torch.nn.Linear] | None:
    """An MLM head -> (its transform: hidden (B, T, H) -> features (B, T, H'), its vocabulary
    projection), so the projection can run inside :func:`splade_max_pool`; None for a layout not
    known here.

    Known: BERT's ``cls.predictions`` (``transform`` then ``decoder``) and RoBERTa/XLM-R's
    ``lm_head`` (``dense``, gelu, ``layer_norm``, ``decoder``). A probe checks that transform then
    projection reproduces the head."""
    predictions = getattr(head, "predictions", None)
    if predictions is not None and hasattr(predictions, "transform"):
        transform, decoder = predictions.transform, getattr(predictions, "decoder", None)
    elif all(hasattr(head, a) for a in ("dense", "layer_norm", "decoder")):
        transform, decoder = _RobertaTransform(head), head.decoder
    else:
        return None
    if not isinstance(decoder, torch.nn.Linear) or not _reproduces(head, transform, decoder):
        return None
    return transform, decoder


class _RobertaTransform(torch.nn.Module):
    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        # a list: not a submodule, so the head's parameters are not registered twice
        self.head = [head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head: Any = self.head[0]  # a RobertaLMHead: dense, then gelu, then layer_norm
        return cast(torch.Tensor, head.layer_norm(torch.nn.functional.gelu(head.dense(x))))


@torch.no_grad()
def _reproduces(head: torch.nn.Module, transform: Head, decoder: torch.nn.Linear) -> bool:
    param = decoder.weight
    probe = torch.randn(1, 3, param.shape[1], generator=torch.Generator().manual_seed(0)).to(param)
    was_training = head.training
    head.eval()
    try:
        return bool(torch.allclose(head(probe), decoder(transform(probe)), rtol=1e-4, atol=1e-5))
    finally:
        head.train(was_training)


class SpladeEncoder(torch.nn.Module):
    """A masked LM with SPLADE max pooling, for training: ``forward(*features) -> [(B, V) per
    features dict]``.

    Encoding several inputs (queries, positives, negatives) in one ``forward`` keeps a DDP wrapper
    to one call per step. The head's vocabulary projection runs inside :func:`splade_max_pool`
    (sparse gradient, no (B, T, V) tensor kept for backward; ``chunk`` tokens at a time, 0 = as the
    memory budget allows); a head that :func:`split_head` does not know is pooled with recomputation
    in slices. The vectors equal the SparseEncoder's (MLM logits + SpladePooling max/relu)."""

    def __init__(self, mlm: PreTrainedModel, chunk: int = 0) -> None:
        super().__init__()
        self.mlm = mlm
        self.chunk = chunk
        # a name, not the module: it must not appear twice in state_dict()
        self.head_name = mlm_head_name(mlm)
        parts = split_head(getattr(mlm, self.head_name)) if self.head_name is not None else None
        # a list: keeps the modules out of state_dict()
        self._split = [parts] if parts is not None else []
        if self.head_name is None:
            log.warning(
                "%s has no single MLM head module: pooling over its full logits (more memory)",
                type(mlm).__name__,
            )

    def encode(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """features (input_ids (B, T), attention_mask (B, T), …) -> (B, V)."""
        inputs = {k: v for k, v in features.items() if k in _ENCODER_INPUTS}
        mask = features["attention_mask"]
        if self.head_name is None:
            return splade_pool(self.mlm(**inputs).logits, mask)
        hidden = self.mlm.base_model(**inputs).last_hidden_state  # (B, T, H)
        if self._split:
            transform, decoder = self._split[0]
            return splade_max_pool(
                transform(hidden), decoder.weight, decoder.bias, mask, self.chunk
            )
        vocab = self.mlm.config.vocab_size
        chunk = self.chunk or slice_tokens(
            hidden.shape[0], hidden.shape[1], vocab, hidden.element_size()
        )
        return splade_pool_chunked(hidden, mask, getattr(self.mlm, self.head_name), chunk)

    def forward(self, *features: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [self.encode(f) for f in features]


def check_mlm(name: str, trust_remote_code: bool = False) -> None:
    """Fail fast, naming ``name``, when it is not a loadable masked LM with its head: tokenizer and
    config load, and a local directory's weights hold the MLM head (a dense encoder would get a
    randomly initialised one)."""
    from transformers import AutoConfig

    load_tokenizer(name, trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load masked-LM model {name!r}: {_first_line(err)}") from None
    if Path(name).is_dir():
        problem = sparse_encoder_problem(Path(name), config, trust_remote_code)
        if problem:
            raise InputError(f"model {name!r} is not a sparse encoder: {problem}")


def sparse_encoder_problem(
    path: Path, config: PretrainedConfig, trust_remote_code: bool = False
) -> str | None:
    """What keeps the directory ``path`` from being a SPLADE-style sparse encoder, in a few words,
    or None.

    A sentence-transformers directory must have a sparse module (SpladePooling, …) rather than dense
    pooling; its masked LM's weights must hold the vocabulary head (``cls.*`` for BERT,
    ``lm_head.*`` for RoBERTa/XLM-R): read from the safetensors headers and an architecture built on
    the meta device, so no weight is loaded."""
    modules = [str(m.get("type", "")) for m in _modules(path)]
    if modules and not any(".sparse_encoder." in t for t in modules):
        shown = ", ".join(t.rsplit(".", 1)[-1] for t in modules)
        return f"its sentence-transformers modules ({shown}) make a dense embedding model"
    keys = _weight_names(path)
    if keys is None:
        pickled = sorted(p.name for p in path.glob("*") if p.suffix in PICKLE_WEIGHTS)
        # never unpickled (a pickle can run code): refused here, before any output is claimed
        if pickled:
            return (
                f"its weights are pickle files only ({', '.join(pickled)}); this project loads safetensors only: "
                "convert them (transformers: from_pretrained(...).save_pretrained(DIR, safe_serialization=True))"
            )
        return "it holds no weights (no *.safetensors file)"
    try:  # the masked-LM head's attribute, the architecture built on the meta device
        with torch.device("meta"):
            head = mlm_head_name(
                AutoModelForMaskedLM.from_config(config, trust_remote_code=trust_remote_code)
            )
    except (ValueError, KeyError, TypeError):
        head = None  # no masked-LM class for this config: loading names that itself
    if head is not None and not any(k.startswith(head + ".") for k in keys):
        found = ", ".join(getattr(config, "architectures", None) or [type(config).__name__])
        return (
            f"its weights ({found}) hold no masked-LM head ({head}.*), which a sparse encoder needs"
        )
    return None


PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Suffixes of weight files in Python's pickle format (``pytorch_model.bin``), which this project
never loads."""


def _modules(path: Path) -> list[dict[str, object]]:
    """The entries of a sentence-transformers ``modules.json`` (none when it is missing or not a
    list)."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def _weight_names(path: Path) -> set[str] | None:
    """Every tensor name in the directory's safetensors files (headers only), or None when there are
    none."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                names.update(fh.keys())
        except Exception as err:  # safetensors raises its own error types for a damaged header
            raise InputError(f"model weights {file} cannot be read: {_first_line(err)}") from None
    return names
