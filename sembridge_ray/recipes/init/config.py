"""The ``init`` job's contract: initialise a target-language sparse encoder from a source one
(SemBridge or a baseline), as a Ray Data job.

    sembridge init --model naver/splade-v3 --target-tokenizer monologg/kobigbird-bert-base \\
        --bridge-model BAAI/bge-m3 --output /shared/init/splade-v3-ko
    python -m jobs.init_embeddings --preset smoke --output /tmp/init-smoke        # the bundled MiniLM, 2 CPUs

Writes ``model/`` (a SentenceTransformers SparseEncoder with its model card),
``provenance.parquet``, ``init_report.json``, ``config.yaml``, ``identity.json`` and ``_SUCCESS``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

from sembridge_ray.bundled import resolve
from sembridge_ray.embed_init.config import MethodName, TransferSettings, WeightingConfig
from sembridge_ray.embed_init.methods import BRIDGE_SETTINGS, METHODS
from sembridge_ray.embed_init.records import InitReport, Sample
from sembridge_ray.embed_init.vocab import MATCH_RULES
from sembridge_ray.recipes import FIGURES, OUTPUT, SCORES, Flag, JobSpec, flags
from sembridge_ray.runtime.config import Config, canonical_key, coerce, require, require_at_least
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.placement import Precision, ResourceConfig
from sembridge_ray.runtime.plans import PlanResult, render_plan


@dataclass(frozen=True, kw_only=True)
class InitConfig(Config):
    """Initialise a target-language sparse encoder from a source one."""

    source_model: str = ""
    """Source SparseEncoder/MLM: hub id, directory, or a bundled name (``minilm-splade``); tied
    embeddings expected, an untied output layer is handled."""
    target_tokenizer: str = ""
    """Target tokenizer: hub id, directory, or a bundled name (``sick-bpe``)."""
    language: str = ""
    """The target language's code, for the model card; empty: the catalog's, when the tokenizer is
    one of the paper's."""
    bridge_model: str = "BAAI/bge-m3"
    """Bridge sentence-transformers model: hub id, directory, or ``minilm`` (the bundled
    all-MiniLM-L6-v2)."""
    output: str = ""
    """Output directory (the model in ``<output>/model``)."""
    method: MethodName = "sembridge"
    """How bridged tokens are initialised: sembridge (the released rule), sembridge_plus (the
    project's recipe, docs/sembridge-plus.md), sembridge_x (the project's cross-lingual recipe,
    docs/xling.md), or the focus/wechsel/omp/fvt/mean/random baselines
    (omp: least-squares codes over the anchors, so its weights may be negative and need not sum to
    1)."""
    bias: Literal["remap", "index", "zero", "frequency"] = "remap"
    """MLM decoder bias: remap (same weights, copies for overlap/specials), index (HF resize), zero,
    or frequency (copies for overlap/specials; bridged tokens by their log-frequency on
    ``bias_text``, at the source bias' mean and spread: ``embed_init.plus``)."""
    bias_text: str = ""
    """With ``bias: frequency``: target-language text to count tokens on: a ``.txt`` file (one text
    per line) or a Parquet file (every string column, e.g. training pairs)."""
    match: tuple[str, ...] = field(
        default=("exact", "fuzzy", "symbols"), metadata={"choices": MATCH_RULES}
    )
    """String rules that make a target token copy a source row, tried in order (comma-separated)."""
    copy_overlap: bool = True
    """False sends every non-special token through the bridge (the low-overlap, cross-lingual
    setting)."""
    exclude_special_sources: bool = False
    """Drop special and [unused*] source tokens from the bridge candidates (the reference keeps
    them)."""
    weighting: WeightingConfig = field(default_factory=WeightingConfig)
    """How a bridged token's row is weighted: α and its candidates, WECHSEL's softmax, OMP's atoms,
    the position-aware rule and SemBridge+'s options (``embed_init.config``; each key also without
    ``weighting.``)."""
    seed: int = 0
    """Seeds the random baseline's rows (and those ``random_blend`` mixes in, and
    ``confidence_gate``'s); read by nothing else."""
    samples: int = 50
    """Target tokens shown with their top-3 source tokens (the paper's Table 3)."""
    bridge_batch_size: int = 256
    """Token strings per bridge-encoder batch (per actor); changes the vectors only by float
    rounding (padding), so not part of the run's identity."""
    rows_batch_size: int = 1024
    """Bridged target tokens per weights batch (per actor); changes the weights only by float
    rounding (GEMM shapes), so not part of the run's identity."""
    cache_dir: str = "~/.cache/sembridge_ray/bridge"
    """Bridge vectors cached as Parquet per (bridge model, tokenizer) fingerprint."""
    trust_remote_code: bool = False
    """Let transformers run code shipped with a hub model (off unless you trust its repository)."""
    dry_run: bool = False
    """Print the plan (the stage, whether its output is already complete, a GPU-hour estimate) and
    run nothing: the schema of ``reproduce --dry-run``."""
    json: bool = False
    """With ``dry_run``: print the plan as JSON instead of the summary table."""
    figures: str = field(default="", metadata=FIGURES)
    """With ``dry_run``: a figures file (JSON throughputs, as the GPU check or ``jobs.bench_peers``
    write them: ``sembridge_ray.recipes.reproduce.figures``) the GPU-hour estimate divides by; empty = the
    built-in rough figures."""
    grid: str = ""
    """Gone: the paper grid is ``sembridge reproduce --preset paper`` (``--dry-run`` prints its
    plan); kept one release so ``--grid`` says so."""
    push_to_hub: str = ""
    """After a successful run, upload the model to this hub repository (``org/name``; needs a token
    and network)."""
    scores: tuple[str, ...] = field(default=(), metadata=SCORES)
    """Finished evaluate and export outputs whose scores the pushed model card shows (with
    ``push_to_hub``): evaluations and exports of this model. Their scores stay in their own
    outputs; the model's output is not written to."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    query_length: int = 64
    """Query tokens the written model encodes with (sentence-transformers' ``query_length``): the
    evaluation's ``max_query_length``, so ``SparseEncoder(model).encode_query`` gives the vectors
    that were scored."""
    document_length: int = 256
    """Document tokens the written model encodes with (its ``document_length`` and
    ``max_seq_length``, capped at the encoder's positions): the evaluation's ``max_doc_length``."""
    precision: Precision = "auto"
    """The bridge encoder's matmuls and the candidate screening: fp32, bf16, or auto = bf16 where
    the actors run on CUDA GPUs that support it (the screening stays fp32 on CUDA), fp32 everywhere
    else. Resolved once in the driver and recorded so; the weights themselves are always solved in
    float64."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    SHORTHANDS: ClassVar[tuple[str, ...]] = ("weighting",)
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "source_model",
        "target_tokenizer",
        "bridge_model",  # identified by content (inputs)
        "output",
        "cache_dir",
        "trust_remote_code",
        "grid",
        "dry_run",
        "json",
        "figures",
        "push_to_hub",
        "scores",
        "overwrite",
        "resources",
        "bias_text",  # identified by content (inputs)
        # how work is cut, not what it computes (float rounding aside: docs/operations.md)
        "bridge_batch_size",
        "rows_batch_size",
    )

    @classmethod
    def upgrade(cls, data: dict[str, object]) -> dict[str, object]:
        """A method's recipe (sembridge_plus) fills in its keys; a key given explicitly (a flag, an
        override, a preset, even at its default value) must agree with it, or the config is refused:
        an explicit value is never silently replaced."""
        name = str(data.get("method", cls.__dataclass_fields__["method"].default)).strip()
        recipe = METHODS[name].recipe if name in METHODS else {}
        given = data.get("weighting", {})
        if not recipe or not isinstance(given, Mapping):
            return data
        hints = typing.get_type_hints(WeightingConfig)
        for key, value in recipe.items():
            if key in given:
                found = coerce(given[key], hints[key], key)
                require(
                    found == value,
                    key,
                    found,
                    f"method {name} fixes it to {value!r} (its recipe); leave it unset",
                )
        return {**data, "weighting": {**recipe, **given}}

    def __post_init__(self) -> None:
        # built directly or by dataclasses.replace (the grid's cells): a recipe sets its keys where
        # they are at the defaults; a conflicting value is refused, so a config always says what ran
        # an unknown one: the check's error
        recipe = METHODS[self.method].recipe if self.method in METHODS else {}
        defaults, fill = WeightingConfig(), dict[str, Any]()
        for key, value in recipe.items():
            current = getattr(self.weighting, key)
            if current == getattr(defaults, key):
                fill[key] = value
            else:
                require(
                    current == value, key, current, f"method {self.method} fixes it to {value!r}"
                )
        if fill:
            object.__setattr__(self, "weighting", replace(self.weighting, **fill))
        super().__post_init__()

    @property
    def reads_seed(self) -> bool:
        """Whether the run draws random rows (the random method's, ``random_blend``'s or
        ``confidence_gate``'s): its seed shapes them."""
        rule = self.rule
        return self.method == "random" or rule.random_blend > 0 or rule.confidence_gate > 0

    @property
    def rule(self) -> WeightingConfig:
        """The weighting section as this run reads it (every option its method does not read at its
        default): what the maths receives, so no option it does not read can reach it."""
        return self.weighting.for_method(self.method, METHODS[self.method].uses_bridge)

    def transfer(self, neutral_symbols: bool = True) -> TransferSettings:
        """What the transfer of this run reads: its keys of the same names, the weighting section as
        the method reads it (:attr:`rule`); ``neutral_symbols``: an ablation, no config key."""
        keys = {f.name for f in fields(TransferSettings)} - {"weighting", "neutral_symbols"}
        own = {key: getattr(self, key) for key in keys}
        return TransferSettings(**own, weighting=self.rule, neutral_symbols=neutral_symbols)

    def resolved(self) -> InitConfig:
        """This config with bundled names (source model, target tokenizer, bridge model)
        materialised to paths, for the workers."""
        names = (self.source_model, self.target_tokenizer, self.bridge_model)
        source, target, bridge = map(resolve, names)
        return replace(self, source_model=source, target_tokenizer=target, bridge_model=bridge)

    def require_inputs(self, note: str = "") -> None:
        """Refuse a config without the inputs every run needs (flags the command line requires)."""
        if not (self.source_model and self.target_tokenizer and self.output):
            raise InputError(f"--model, --target-tokenizer and --output are required{note}")

    def check(self) -> None:
        require(
            not self.grid,
            "grid",
            self.grid,
            "init --grid is gone: the paper grid is `sembridge reproduce --preset paper` (--dry-run prints its plan)",
        )
        self.weighting.check_method(self.method)
        require_at_least(self, 1, "bridge_batch_size rows_batch_size query_length document_length")
        require(self.samples >= 0, "samples", self.samples, "must be >= 0")
        require(
            (self.bias == "frequency") == bool(self.bias_text),
            "bias_text",
            self.bias_text or "(empty)",
            "is read by bias=frequency, and bias=frequency needs it (a .txt or Parquet file of target text)",
        )
        unknown = [m for m in self.match if m not in MATCH_RULES]
        require(
            not unknown,
            "match",
            ",".join(self.match),
            f"unknown rule {unknown[0] if unknown else ''!r} (known: {', '.join(MATCH_RULES)})",
        )

    def unread(self) -> set[str]:
        # each weighting option says when it is read (embed_init.config.Read)
        entry = METHODS[self.method]
        unread = {
            f"weighting.{f.name}"
            for f in fields(WeightingConfig)
            if not self.weighting.reads(f.name, self.method, entry.uses_bridge)
        }
        if not entry.uses_bridge:
            unread |= set(BRIDGE_SETTINGS)
        if not self.reads_seed:
            unread.add("seed")  # only the random rows are seeded
        return unread

    def why_unused(self, key: str) -> str:
        key = canonical_key(type(self), key)
        section, _, name = key.partition(".")
        if section != "weighting":
            if key in BRIDGE_SETTINGS and not METHODS[self.method].uses_bridge:
                return f"method {self.method} uses no bridge"
            if key == "seed":
                return (
                    "only the random rows are seeded (method random, random_blend, confidence_gate)"
                )
            return super().why_unused(key)
        rule = WeightingConfig.rule(name)
        if rule.methods and self.method not in rule.methods:
            return f"method {self.method} does not read it; only {' and '.join(rule.methods)} does"
        if rule.bridge and not METHODS[self.method].uses_bridge:
            return f"method {self.method} uses no bridge"
        return self.weighting.why_unused(name)


@dataclass(frozen=True, kw_only=True)
class InitResult:
    """What an init run produced (``init_report.json`` holds the full report)."""

    output: str
    model: str
    """The SparseEncoder directory: ``SparseEncoder(model)``."""
    method: str
    alpha: float | None
    kinds: dict[str, int]
    """Target tokens per kind: overlap (copied), special, bridge, random."""
    support_histogram: dict[str, int]
    samples: list[Sample]
    timings: dict[str, float]
    report: InitReport
    """Everything ``init_report.json`` holds."""
    skipped: bool = False
    """The output was already complete with the same settings."""
    pushed: str = ""
    """The hub URL the model was pushed to by this run (``push_to_hub``; recorded in
    ``pushed.json``)."""

    @classmethod
    def from_report(cls, output: str, report: InitReport, skipped: bool = False) -> InitResult:
        return cls(
            output=output,
            model=f"{output}/model",
            method=report["method"],
            alpha=report["alpha"] if report["method"] == "sembridge" else None,
            kinds=report["kinds"],
            support_histogram=report["support_histogram"],
            samples=report["samples"],
            timings=report["timings"],
            report=report,
            skipped=skipped,
        )


FLAGS = flags(
    Flag(name="--model", key="source_model", aliases=("--source-model",), required=True),
    Flag(key="target_tokenizer", required=True),
    "bridge_model",
    OUTPUT,
    "method alpha match bias seed position_aware bridge_space fvt_weight lsq_ridge",
    "adaptive_support support_size random_blend bias_text grid dry_run json figures",
    Flag(name="--max-query-length", key="query_length"),
    Flag(name="--max-doc-length", key="document_length"),
    "resources.workers resources.gpus_per_worker precision push_to_hub scores",
    "trust_remote_code overwrite",
)


def report(result: InitResult | PlanResult) -> str:
    from sembridge_ray.embed_init.report import sample_table

    if isinstance(result, PlanResult):
        return render_plan(result)

    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(result.kinds.items()))
    return (
        f"{sample_table(result.samples)}\n\ntarget tokens: {counts}\n"
        f'model: {result.model}   (SparseEncoder("{result.model}"))'
    )


JOB = JobSpec(
    summary="initialise a target-language encoder (SemBridge or a baseline); Ray Data",
    entry="init_embeddings",
    config=InitConfig,
    flags=FLAGS,
    dry_driver="sembridge_ray.recipes.reproduce.plan:init_dry_run_result",
    report=report,
)
