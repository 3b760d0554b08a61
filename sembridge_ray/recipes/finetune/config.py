"""The ``finetune`` job's contract: fine-tune a SparseEncoder with InfoNCE + FLOPs on Ray Train
(DDP), checkpointed and resumable; the paper's recipe is batch 64, lr 2e-5, bf16, 1 epoch.

    sembridge finetune --preset paper --model /shared/init/ar/model --train webfaq:ar --output /shared/ft/ar \\
        --workers 4
    python -m jobs.finetune --preset smoke --output /tmp/ft-smoke       # the bundled MiniLM SPLADE, 2 CPUs

Writes ``model/`` (SparseEncoder + model card), ``metrics.jsonl`` (one line per logged step),
``finetune.json``, ``checkpoints/``, ``data/`` (the materialised training stream), ``config.yaml``,
``identity.json`` and ``_SUCCESS``. """

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Literal, get_args

from sembridge_ray.bundled import resolve
from sembridge_ray.recipes import OUTPUT, SCORES, Flag, JobSpec, flags
from sembridge_ray.runtime.config import Config, dotted_keys, require, require_at_least
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.placement import Precision, ResourceConfig
from sembridge_ray.sparse.config import LossConfig, OptimConfig, RankingName

log = logging.getLogger(__name__)
_BF16_WORDS = {"on": "bf16", "off": "fp32"}  # the values of the former --bf16 flag
BatchSampler = Literal["no_duplicates", "batch_sampler"]
Select = Literal["last", "best"]


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig(Config):
    """Fine-tune a SparseEncoder directory on a retrieval training set with Ray Train (DDP)."""

    model: str = ""
    """SparseEncoder / masked-LM directory (as written by the init job)."""
    train: str = ""
    """webfaq:<lang>, miracl:<lang>[@MIRROR], a BEIR directory, or a .parquet file of pairs."""
    output: str = ""
    """Output directory: the fine-tuned SparseEncoder in ``<output>/model``, metrics.jsonl,
    config.yaml, checkpoints/, _SUCCESS."""
    split: str = "train"
    """Split of a retrieval dataset whose judgements make the training pairs."""
    hard_negatives: int = 0
    """Judged non-relevant documents per query used as extra negatives (0 = in-batch negatives
    only)."""
    max_query_length: int = 64
    """Query tokens (the same key as in evaluation)."""
    max_doc_length: int = 256
    """Document tokens (the same key as in evaluation)."""
    pool_chunk: int = 0
    """Tokens per slice of the vocabulary projection in SPLADE pooling (0 = as many as a 256 MiB
    logits budget allows; see ``sparse.pooling.POOL_BUDGET_BYTES``): memory, not results (the same
    weights bit for bit), so not part of the run's identity."""
    seed: int = 0
    """Seeds the pair order (one permutation per epoch) and dropout."""
    checkpoint_every: int = 500
    """Checkpoint every K steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints Ray Train keeps (the newest ones)."""
    storage: str = ""
    """Where checkpoints go: a path or a URI Ray supports (s3://, gs://); empty =
    <output>/checkpoints."""
    max_failures: int = 3
    """Worker-group restarts from the latest checkpoint before the run fails."""
    log_every: int = 10
    """Log and record metrics every K steps (part of the run's identity: it decides the lines of
    metrics.jsonl)."""
    report_every_s: float = 10.0
    """Least seconds between metric reports to Ray Train on logged steps (checkpoint steps always
    report). Ray Train V2 takes in one report per 2 s health check, and a faster report blocks the
    training step until then."""
    trust_remote_code: bool = False
    """Let transformers run code shipped with a hub model (off unless you trust its repository)."""
    push_to_hub: str = ""
    """After a successful run, upload the model to this hub repository (``org/name``; needs a token
    and network)."""
    scores: tuple[str, ...] = field(default=(), metadata=SCORES)
    """Finished evaluate and export outputs whose scores the pushed model card shows (with
    ``push_to_hub``): evaluations and exports of this model, and evaluations of the model it was
    fine-tuned from (its zero-shot column). Their scores stay in their own outputs; the model's
    output is not written to."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    query_length: int = 64
    """Query tokens the written model encodes with (sentence-transformers' ``query_length``): the
    evaluation's ``max_query_length``, so ``SparseEncoder(model).encode_query`` gives the vectors
    that were scored."""
    document_length: int = 256
    """Document tokens the written model encodes with (its ``document_length`` and
    ``max_seq_length``, capped at the encoder's positions): the evaluation's ``max_doc_length``."""
    batch_sampler: BatchSampler = "no_duplicates"
    """How pairs are batched: ``no_duplicates`` (sentence-transformers'
    ``BatchSamplers.NO_DUPLICATES``: no text twice in a global batch, so no in-batch negative is
    another query's copy of a positive) or ``batch_sampler`` (a plain seeded shuffle, as before)."""
    eval: str = ""
    """Development set scored during training (the forms of ``train``); empty = none. Never a test
    split."""
    eval_split: str = "dev"
    """Its split (SICK's dev is its trial split; ``test`` is refused)."""
    eval_every: int = 0
    """Evaluate every K steps, before the first step and at the end; 0 = every tenth of the run."""
    eval_at: tuple[int, ...] = ()
    """Evaluate at exactly these steps (and at step 0 and the last step), e.g. the log-spaced
    ``0,1,2,4,8,16,32,64`` of a convergence curve; replaces ``eval_every``. Empty = ``eval_every``."""
    eval_max_queries: int = 0
    """Score a seeded sample of this many judged queries (against the whole corpus); 0 = all of
    them."""
    select: Select = "last"
    """Which weights ``model/`` publishes: ``last`` (the paper's recipe) or ``best`` (the evaluated
    step with the highest dev nDCG@10 whose vectors are not collapsed; needs ``eval``)."""
    tensorboard: bool = False
    """Also write losses, sparsity and dev scores as TensorBoard event files under
    ``<output>/tensorboard``."""
    precision: Precision = "auto"
    """bf16 autocast or fp32 for the model's matmuls (the loss is always fp32): auto = bf16 where
    the workers run on CUDA GPUs that support it, fp32 everywhere else. Resolved once in the driver
    and recorded so."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    # Identified by content (inputs), or changing nothing a run computes: a rerun that differs only
    # in these resumes the same run.
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "model",
        "train",
        "output",
        "pool_chunk",  # the same loss and gradients bit for bit, in slices of another size
        "storage",
        "checkpoint_every",
        "keep_checkpoints",
        "max_failures",
        "report_every_s",
        "push_to_hub",
        "scores",
        "trust_remote_code",  # may load a model, changes nothing it computes
        "overwrite",
        "tensorboard",
        # but resources.workers: each rank draws its own dropout masks (seeded by seed and rank) over
        # its share of the batch, so 1 and 2 workers train apart (max |diff| ~1e-3 after a few
        # steps); the batches, their order and the loss are the same for any number. The driver
        # runs exactly this many (run_finetune refuses a cluster that fits fewer).
        "resources.gpus_per_worker",
        "resources.cpus_per_worker",
        "resources.reserve_cpus",
        "resources.threads_per_worker",
    )

    EVAL_SETTINGS: ClassVar[tuple[str, ...]] = (
        "eval_split",
        "eval_every",
        "eval_at",
        "eval_max_queries",
        "select",
    )
    """Read only with a development set (``eval``): without one they change nothing (``select`` is
    ``last``)."""

    def unread(self) -> set[str]:
        unread = set() if self.eval else set(self.EVAL_SETTINGS)
        if self.eval_at:  # it replaces eval_every
            unread.add("eval_every")
        if not self.optim.embedding_warmup_steps:  # the other warm-up keys (the steps turn it on)
            unread |= {
                k
                for k in dotted_keys(type(self))
                if k.startswith("optim.embedding_warmup_") and k != "optim.embedding_warmup_steps"
            }
        return unread

    def why_unused(self, key: str) -> str:
        if key in self.EVAL_SETTINGS and not self.eval:
            return "it is read with a development set (--eval) only"
        if key == "eval_every" and self.eval_at:
            return "eval_at sets the evaluated steps"
        if key.startswith("optim.embedding_warmup_"):
            return "it is read with optim.embedding_warmup_steps > 0 only"
        return super().why_unused(key)

    @classmethod
    def upgrade(cls, data: dict[str, object]) -> dict[str, object]:
        """``optim.bf16`` (auto/on/off) is now ``precision`` (auto/bf16/fp32): both spellings still
        work."""
        optim = data.get("optim")
        if isinstance(optim, dict) and "bf16" in optim:
            log.warning(
                "config key optim.bf16 is now precision (on = bf16, off = fp32); the old name goes soon"
            )
            data = {
                **data,
                "optim": {k: v for k, v in optim.items() if k != "bf16"},
                "precision": optim["bf16"],
            }
        value = str(data.get("precision", "")).strip().lower()
        if value in _BF16_WORDS:
            data = {**data, "precision": _BF16_WORDS[value]}
        return data

    def check(self) -> None:
        require_at_least(self, 1, "max_query_length max_doc_length query_length document_length")
        require_at_least(self, 1, "checkpoint_every log_every keep_checkpoints")
        require_at_least(self, 0, "hard_negatives pool_chunk max_failures report_every_s")
        require_at_least(self, 0, "eval_every eval_max_queries")
        require(
            all(step >= 0 for step in self.eval_at),
            "eval_at",
            ",".join(map(str, self.eval_at)),
            "steps must be >= 0",
        )
        # the registry loads pyarrow: not for every import
        from sembridge_ray.data.registry import is_test_split

        require(
            self.eval_split != "test",
            "eval_split",
            self.eval_split,
            "is a test split: choose recipes on dev data",
        )
        require(
            not (self.eval and is_test_split(self.eval, self.eval_split)),
            "eval_split",
            self.eval_split,
            f"of {self.eval}: it is what evaluate scores as its test (MIRACL's test judgements are hidden, its dev "
            "ones are the test); choose recipes on other development data (e.g. a held-out part of MIRACL train)",
        )

    def resolved(self) -> FinetuneConfig:
        """This config with bundled names (model, training and development data) materialised to
        paths, for the workers."""
        return replace(
            self,
            model=resolve(self.model),
            train=resolve(self.train),
            eval=resolve(self.eval) if self.eval else "",
        )

    def require_inputs(self) -> None:
        """Raise :class:`InputError` naming the first required setting that is missing."""
        for name in ("model", "train", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")
        if self.select == "best" and not self.eval:
            raise InputError("--select best needs a development set: --eval DATASET")


@dataclass(frozen=True, kw_only=True)
class FinetuneResult:
    """What a fine-tuning run produced (``finetune.json`` holds it, with the training stream's
    statistics)."""

    output: str
    model: str
    """The fine-tuned SparseEncoder directory: ``SparseEncoder(model)``."""
    steps: int
    run_name: str = ""
    storage: str = ""
    resumed_from: int | None = None
    workers: int = 0
    seconds: float = 0.0
    final: dict[str, float] = field(default_factory=dict)
    """The metrics of the last logged step."""
    skipped: bool = False
    """The output was already complete with the same settings."""
    pushed: str = ""
    """The hub URL the model was pushed to by this run (``push_to_hub``; recorded in
    ``pushed.json``)."""
    select: str = "last"
    best: dict[str, object] = field(default_factory=dict)
    """The published step and why (``step``, ``dev_nDCG@10``, ``reason``); empty without a
    development set."""
    collapsed: list[dict[str, object]] = field(default_factory=list)
    """Evaluated steps whose vectors collapsed (``step``, ``reason``): never selected."""
    convergence: dict[str, object] = field(default_factory=dict)
    """Of the dev curve (``sparse.convergence``): ``final``, ``steps_to_95``, ``auc``,
    ``evaluations``."""
    eval_seconds: float = 0.0
    """Wall time the workers spent evaluating (part of ``seconds``)."""

    @property
    def ok(self) -> bool:
        return self.steps > 0

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], skipped: bool = False) -> FinetuneResult:
        """From ``finetune.json`` (its other keys, such as the stream's statistics, are left
        out)."""
        names = set(cls.__dataclass_fields__) - {"skipped", "pushed"}
        return cls(**{k: v for k, v in summary.items() if k in names}, skipped=skipped)


FLAGS = flags(
    Flag(key="model", required=True),
    Flag(key="train", required=True),
    OUTPUT,
    "resources.workers resources.gpus_per_worker",
    "optim.batch_size optim.lr optim.epochs optim.max_steps loss.lambda_q loss.lambda_d",
    "checkpoint_every eval eval_every eval_at select tensorboard",
    Flag(key="precision", aliases=("--bf16",)),
    "max_query_length max_doc_length push_to_hub scores trust_remote_code overwrite",
)


def report(result: FinetuneResult) -> str:
    shown = ("loss", *get_args(RankingName), "active_dims_d")  # the ranking loss under its own name
    final = ", ".join(f"{k} {v:.4g}" for k, v in result.final.items() if k in shown)
    done = (
        "already complete" if result.skipped else f"{result.steps} steps in {result.seconds:.0f} s"
    )
    return json.dumps(asdict(result), indent=2) + f"\n{done} ({final})\nmodel: {result.model}"


JOB = JobSpec(
    summary="fine-tune with InfoNCE + FLOPs, checkpointed and resumable; Ray Train",
    config=FinetuneConfig,
    flags=FLAGS,
    report=report,
)
