"""The MaLSTM's settings, section by section, beside the code that reads them: the word vectors
(``siamese.vectors``, ``siamese.prepare``), the thesaurus augmentation (``siamese.augment``), a
training stage and the STS pretraining (``siamese.loop``) and the calibration (``siamese.results``).
``sembridge_ray.recipes.malstm.config`` composes them into the job's config; their field names are its dotted
keys (``train.lr``, ``vectors.source``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sembridge_ray.runtime.config import Config, require

MINILM, MINILM_CONTEXT, MINILM_INPUT = "minilm", "minilm-context", "minilm-input"
"""The named word-vector sources (``siamese.vectors``); anything else is ``word2vec:PATH``."""

__all__ = ["AugmentConfig", "CalibrationConfig", "PretrainConfig", "TrainConfig", "VectorConfig"]


@dataclass(frozen=True, kw_only=True)
class VectorConfig(Config):
    """Fixed word vectors."""

    source: str = "minilm"
    """``minilm`` (each word alone through the bundled all-MiniLM-L6-v2, 384-d), ``minilm-context``
    (MiniLM hidden states of the word averaged over its contexts in SICK train/trial, STS and
    WordNet text; Bommasani et al. 2020), ``minilm-input`` (MiniLM's input word-piece embeddings,
    averaged) or ``word2vec:PATH`` (the paper's GoogleNews 300-d, or any word2vec file, binary or
    text)."""
    layer: int = 6
    """``minilm-context``: hidden layer to read (0 = the embedding layer's output, 6 = the last)."""
    pooling: Literal["mean", "first"] = "mean"
    """``minilm-context``: how a word's pieces are pooled within one context."""
    contexts: int = 10
    """``minilm-context``: a word's vector averages its first N occurrences in the corpus (in corpus
    order)."""
    retrofit: int = 0
    """Retrofit the vectors to the thesaurus (Faruqui et al. 2015) with this many iterations (10 in
    the paper); 0 = off. Works with every source."""
    normalize: bool = True
    """Scale known vectors to length ``scale`` (all-MiniLM-L6-v2 already outputs unit vectors;
    word2vec does not)."""
    scale: float = 1.0
    """Norm of the known vectors after normalising (GoogleNews word2vec vectors have norms of about
    2-3)."""
    center: bool = False
    """Subtract the mean known vector first (before the cosine gate and the model see them)."""
    oov_std: float = 0.01
    """Per-component std of the seeded random vectors of out-of-vocabulary words."""
    cache_dir: str = "~/.cache/sembridge_ray/word_vectors"
    """Where MiniLM word vectors are cached, per word (only new words are encoded), keyed by source,
    model, corpus, contexts, layer and pooling."""

    def check(self) -> None:
        require(self.scale > 0, "scale", self.scale, "must be > 0")
        require(self.oov_std >= 0, "oov_std", self.oov_std, "must be >= 0")
        require(0 <= self.layer <= 6, "layer", self.layer, "MiniLM-L6 has layers 0-6")
        require(self.contexts >= 1, "contexts", self.contexts, "must be >= 1")
        require(self.retrofit >= 0, "retrofit", self.retrofit, "must be >= 0 (0 = off)")


@dataclass(frozen=True, kw_only=True)
class AugmentConfig(Config):
    """Thesaurus augmentation of the SICK training part (never the validation split)."""

    enabled: bool = True
    """Add thesaurus-substituted copies of the training pairs (the paper does)."""
    passes: int = 10
    """Substitution passes over the training pairs (each may add one new pair per pair)."""
    min_cosine: float = 0.6
    """The paper's gate: a substitution needs word-vector cosine >= this."""
    target_pairs: int = 0
    """> 0: raise the gate (never below ``min_cosine``) until at most this many new pairs remain; 0
    = fixed gate."""
    thesaurus: Literal["auto", "wordnet", "bundled"] = "auto"
    """``auto``: WordNet 3.0 through nltk when it is found, else the bundled thesaurus of the SICK
    training vocabulary."""
    wordnet_dir: str = ""
    """Extra nltk data directory to search for WordNet (besides ``NLTK_DATA`` and nltk's
    defaults)."""

    def check(self) -> None:
        require(self.passes >= 0, "passes", self.passes, "must be >= 0")
        require(-1 <= self.min_cosine <= 1, "min_cosine", self.min_cosine, "must be in [-1, 1]")
        require(
            self.target_pairs >= 0,
            "target_pairs",
            self.target_pairs,
            "must be >= 0 (0 = fixed gate)",
        )


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Config):
    """One training stage (STS pretraining or SICK training)."""

    hidden: int = 50
    """LSTM hidden size (the paper's 50)."""
    batch_size: int = 32
    """Pairs per Adadelta step."""
    lr: float = 1.0
    """Adadelta's step multiplier (1.0 is Adadelta as published)."""
    rho: float = 0.95
    """Adadelta's decay of the squared-gradient averages."""
    eps: float = 1e-6
    """Adadelta's epsilon."""
    clip_norm: float = 1.0
    """Gradient-norm clipping threshold."""
    max_epochs: int = 300
    """Epochs at most."""
    patience: int = 30
    """Stop after this many epochs without a new best (smoothed) validation loss."""
    stop_on: Literal["mse", "pearson"] = "mse"
    """Early-stopping loss on validation: the raw MSE, or 1 − Pearson r (what survives
    calibration)."""
    smoothing: float = 0.0
    """Exponential moving average factor for the stopping criterion (0 = the raw validation
    loss)."""
    min_delta: float = 0.0
    """Least improvement of the stopping loss that counts as a new best."""
    weight_ema: float = 0.0
    """> 0: evaluate and keep an exponential moving average of the weights with this per-step decay
    (Polyak averaging; not in the paper). 0 = the optimiser's own iterates, as the paper."""
    forget_bias: float = 1.5
    """Initial bias of the LSTM's forget gate."""
    init_sigma: float = 0.2
    """σ of the authors' initialisation (see ``model.init_lstm``)."""

    def check(self) -> None:
        for key in ("hidden", "batch_size", "max_epochs", "patience"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        for key in ("eps", "init_sigma"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        require(self.lr >= 0, "lr", self.lr, "must be >= 0 (0 freezes the weights)")
        require(0 < self.rho < 1, "rho", self.rho, "must be in (0, 1)")
        require(self.clip_norm >= 0, "clip_norm", self.clip_norm, "must be >= 0")
        require(self.min_delta >= 0, "min_delta", self.min_delta, "must be >= 0")
        for key in ("smoothing", "weight_ema"):
            require(0 <= getattr(self, key) < 1, key, getattr(self, key), "must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(Config):
    """STS pretraining, with its own validation split and early stopping."""

    enabled: bool = True
    """Pretrain on STS before training on SICK (the paper does)."""
    years: tuple[int, ...] = (2012, 2013)
    """STS years in the pool; 2012 + 2013 is the paper's "SemEval 2013 STS" as far as it is
    redistributable."""
    max_epochs: int = 100
    """Pretraining epochs at most."""
    patience: int = 10
    """Stop pretraining after this many epochs without a new best validation loss."""
    limit: int = 0
    """Use only the first N pool pairs (0 = all; smoke runs)."""

    def check(self) -> None:
        bad = [y for y in self.years if y not in range(2012, 2017)]
        require(not bad, "years", ",".join(map(str, self.years)), "STS years are 2012-2016")
        for key in ("max_epochs", "patience"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.limit >= 0, "limit", self.limit, "must be >= 0 (0 = all)")


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig(Config):
    """Local-linear calibration of the raw scores, fitted on validation (statsmodels
    ``KernelReg``)."""

    enabled: bool = True
    """Calibrate (the paper does; it raises Pearson r, never Spearman ρ)."""
    bandwidth: Literal["loo", "cv_ls"] = "loo"
    """``loo``: the vectorised exact leave-one-out search; ``cv_ls``: statsmodels' own (slow)
    search."""
