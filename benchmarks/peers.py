"""The project against the tools a user would otherwise run, side by side (``python -m
jobs.bench_peers``).

Each side of a comparison runs in its own child process (``python -m benchmarks.peers --side …``),
so peak RSS is that side's alone; the parent alternates the sides (A B A B …) so a burst of load
elsewhere hits both alike, and reports the median of each side, the throughput ratio (project ÷
peer) and the peak-memory ratio.

- ``train``: one fine-tuning step on the bundled MiniLM SPLADE, the same pre-tokenised batches on
  both sides: ``sparse.loop.train`` (``SpladeEncoder``, sparse-gradient pooling) vs
  ``SparseEncoder`` + ``SpladeLoss(SparseMultipleNegativesRankingLoss)``, both with AdamW, the same
  schedule and gradient clipping. Dropout is off on both so the losses can be compared step by step.
- ``encode``: documents through the Ray Data actor's code (``SparseEncodeUDF`` on one staged file)
  vs ``SparseEncoder.encode_document`` over the same list; then both in fp32 and bf16 (the project's
  ``precision=bf16``, the peer under ``torch.autocast``), with the largest difference bf16 makes to
  the vectors.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from benchmarks import child_env
from benchmarks.measured import Rates
from benchmarks.records import (
    Differences,
    EncodeLine,
    InitLine,
    PrecisionLine,
    RayDataTiming,
    StepTimes,
    Timing,
    TrainLine,
)
from sembridge_ray.bundled import resolve

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
MODEL = "minilm-splade"


@dataclass(frozen=True, kw_only=True)
class TrainCase:
    """One comparison of training steps: batch pairs of (query_length, doc_length) tokens, full
    length."""

    batch: int = 16
    query_length: int = 64
    doc_length: int = 128
    steps: int = 4
    """Steps per run; the first is a warm-up, left out of the rate."""
    lambda_q: float = 5e-5
    lambda_d: float = 3e-5
    lr: float = 2e-5
    threads: int = 2


@dataclass(frozen=True, kw_only=True)
class EncodeCase:
    texts: int = 512
    max_length: int = 256
    batch: int = 64
    threads: int = 2
    precision: str = "fp32"
    """fp32, or bf16: the project's ``precision=bf16``, the peer under ``torch.autocast(bf16)``."""


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def long_texts(count: int, per_text: int, side: str = "a") -> list[str]:
    """``count`` texts of ``per_text`` consecutive SICK sentences each (long enough to fill the max
    length)."""
    from sembridge_ray.data.sick import read_sick_split
    from sembridge_ray.resources import sick_dir

    pairs = read_sick_split(sick_dir(), "train")
    sents = [p.a if side == "a" else p.b for p in pairs]
    return [
        " ".join(sents[(i * per_text + j) % len(sents)] for j in range(per_text))
        for i in range(count)
    ]


def train_batches(
    case: TrainCase, tokenizer: PreTrainedTokenizerBase
) -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """``case.steps`` (queries, positives) feature pairs padded to exactly the case's lengths."""

    def tok(texts: list[str], length: int) -> dict[str, torch.Tensor]:
        return dict(
            tokenizer(
                texts, padding="max_length", truncation=True, max_length=length, return_tensors="pt"
            )
        )

    n = case.batch * case.steps
    queries, docs = long_texts(n, 6, "a"), long_texts(n, 12, "b")
    cut = range(0, n, case.batch)
    return [
        (
            tok(queries[s : s + case.batch], case.query_length),
            tok(docs[s : s + case.batch], case.doc_length),
        )
        for s in cut
    ]


M = TypeVar("M", bound=torch.nn.Module)


def _no_dropout(model: M) -> M:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _timed_steps(steps: Iterator[float]) -> StepTimes:
    """Consume (loss per step), timing each; rate over every step but the first."""
    times, losses, before = [], [], rss_mb()
    clock = time.perf_counter()
    for loss in steps:
        now = time.perf_counter()
        times.append(now - clock)
        losses.append(loss)
        clock = now
    return {
        "step_s": times,
        "losses": losses,
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }


def train_project(case: TrainCase) -> StepTimes:
    from sembridge_ray.recipes.finetune.config import LossConfig, OptimConfig
    from sembridge_ray.sparse import loop
    from sembridge_ray.sparse.model import SpladeEncoder, load_mlm

    mlm, tok = load_mlm(resolve(MODEL))
    model = SpladeEncoder(_no_dropout(mlm))
    optim = OptimConfig(lr=case.lr, warmup_ratio=0.0)
    optimizer, scheduler = loop.build_optimizer(model, optim, case.steps)
    plan = loop.LoopPlan(
        total_steps=case.steps,
        global_batch=case.batch,
        loss=LossConfig(lambda_q=case.lambda_q, lambda_d=case.lambda_d, flops_warmup=0.0),
        clip_norm=optim.clip_norm,
        log_every=1,
    )
    batches = [loop.PairBatch(q, [d]) for q, d in train_batches(case, tok)]
    steps = loop.train(model, batches, optimizer, scheduler, plan)
    return _timed_steps(m["loss"] for _, m in steps if m is not None)


def train_peer(case: TrainCase) -> StepTimes:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.losses import (
        SparseMultipleNegativesRankingLoss,
        SpladeLoss,
    )

    from sembridge_ray.recipes.finetune.config import OptimConfig
    from sembridge_ray.sparse import loop

    model = _no_dropout(SparseEncoder(resolve(MODEL), device="cpu"))
    model.train()  # SpladePooling works in place in eval mode (ENVIRONMENT.md)
    splade = SpladeLoss(
        model,
        SparseMultipleNegativesRankingLoss(model),
        document_regularizer_weight=case.lambda_d,
        query_regularizer_weight=case.lambda_q,
    )
    optim = OptimConfig(lr=case.lr, warmup_ratio=0.0)
    optimizer, scheduler = loop.build_optimizer(model, optim, case.steps)
    batches = train_batches(case, model.tokenizer)

    def steps() -> Iterator[float]:
        for q, d in batches:
            total = sum(splade([q, d], None).values())
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
            optimizer.step()
            scheduler.step()
            yield float(total.detach())

    return _timed_steps(steps())


def sick_texts(count: int) -> list[str]:
    """``count`` SICK sentences (A and B sides of the train split, in file order)."""
    from sembridge_ray.data.sick import read_sick_split
    from sembridge_ray.resources import sick_dir

    pairs = read_sick_split(sick_dir(), "train")
    return [s for p in pairs for s in (p.a, p.b)][:count]


def _timed(fn: Callable[[], object]) -> Timing:
    fn()  # warm-up (first-call allocations, thread pools)
    before, start = rss_mb(), time.perf_counter()
    fn()
    return {
        "seconds": time.perf_counter() - start,
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }


def encode_project(case: EncodeCase) -> Timing:
    """The Ray Data actor's code, in this process: SparseEncodeUDF on one staged (id, text) Parquet
    file."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sembridge_ray.data.schema import ID, TEXT
    from sembridge_ray.sparse.encode_files import PATH, SparseEncodeUDF

    texts = sick_texts(case.texts)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "part-0.parquet"
        pq.write_table(pa.table({ID: [str(i) for i in range(len(texts))], TEXT: texts}), staged)
        udf = SparseEncodeUDF(
            resolve(MODEL),
            case.max_length,
            case.batch,
            str(Path(tmp) / "out"),
            role="document",
            precision=case.precision,
        )
        (Path(tmp) / "out").mkdir()
        return _timed(lambda: udf(pa.table({PATH: [str(staged)]})))


RAY_DATA_FILES = (1, 5)
"""Staged files (each of the case's texts) the Ray Data side encodes, in two runs on one cluster:
both pay the actor's start and model load, so their difference is the steady rate and the remainder
the start-up."""


def encode_ray_data(case: EncodeCase) -> RayDataTiming:
    """The evaluate job's own ``encode`` (Ray Data, a pool of one actor with the case's threads, on
    a local 2-CPU cluster started before the clock), timed on ``RAY_DATA_FILES`` staged copies of
    the texts. Peak RSS would be the driver's only, so it is not reported."""
    import tempfile

    import pyarrow as pa

    from sembridge_ray.data.schema import ID, TEXT
    from sembridge_ray.distributed import cluster
    from sembridge_ray.distributed.executor import RayExecutor
    from sembridge_ray.recipes.evaluate.config import EvaluateConfig
    from sembridge_ray.retrieval.encode import encode
    from sembridge_ray.retrieval.store import stage_corpus
    from sembridge_ray.runtime.placement import ResourceConfig

    cluster.connect(num_cpus=2)
    texts = sick_texts(case.texts)
    seconds = []
    for run, count in enumerate(RAY_DATA_FILES):
        with tempfile.TemporaryDirectory() as tmp:
            tables = (
                pa.table({ID: [f"{f}-{i}" for i in range(len(texts))], TEXT: texts})
                for f in range(count)
            )
            files = stage_corpus(tables, Path(tmp) / "staged")
            cfg = EvaluateConfig(
                output=tmp,
                max_doc_length=case.max_length,
                encode_batch_size=case.batch,
                resources=ResourceConfig(workers=1, threads_per_worker=case.threads),
            )
            start = time.perf_counter()
            dest = Path(tmp) / f"vectors-{run}"
            encode(files, dest, cfg.encoding(), resolve(MODEL), "document", RayExecutor())
            seconds.append(time.perf_counter() - start)
    small, large = RAY_DATA_FILES
    out: RayDataTiming = {
        "texts": large * len(texts),
        "end_to_end_texts_per_s": round(large * len(texts) / seconds[1], 2),
    }
    if seconds[1] <= seconds[0]:  # the load changed between the two runs: no steady rate to be had
        return out | {
            "steady_texts_per_s": None,
            "startup_s": None,
            "seconds": [round(t, 2) for t in seconds],
        }
    steady = (large - small) * len(texts) / (seconds[1] - seconds[0])
    return out | {
        "steady_texts_per_s": round(steady, 2),
        "startup_s": round(seconds[0] - small * len(texts) / steady, 2),
    }


def mean_tokens(texts: list[str], max_length: int) -> float:
    from sembridge_ray.sparse.model import load_tokenizer

    tok = load_tokenizer(resolve(MODEL))
    return float(sum(min(max_length, len(ids)) for ids in tok(texts)["input_ids"]) / len(texts))


def encode_peer(case: EncodeCase) -> Timing:
    from sembridge_ray.sparse.model import load_sparse_encoder

    texts = sick_texts(case.texts)
    model = load_sparse_encoder(resolve(MODEL), max_length=case.max_length)

    def run() -> object:
        with _autocast(case.precision):
            return model.encode_document(texts, batch_size=case.batch, show_progress_bar=False)

    return _timed(run)


def _autocast(precision: str) -> AbstractContextManager[object]:
    import contextlib

    return (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )


def encode_differences(case: EncodeCase) -> Differences:
    """Max |difference| of the document vectors: project bf16 vs fp32, peer (autocast) bf16 vs fp32,
    project fp32 vs peer fp32 (untimed)."""
    from sembridge_ray.sparse.encode import encode_texts
    from sembridge_ray.sparse.model import load_sparse_encoder

    texts = sick_texts(case.texts)
    model = load_sparse_encoder(resolve(MODEL), max_length=case.max_length)
    dim = model.get_embedding_dimension()
    assert dim is not None  # a SPLADE encoder's is its vocabulary's

    def ours(precision: str) -> torch.Tensor:
        indices, values = encode_texts(model, texts, case.batch, "document", None, precision)
        out = torch.zeros(len(texts), dim)
        for row, (i, v) in enumerate(zip(indices, values, strict=True)):
            out[row, torch.from_numpy(i).long()] = torch.from_numpy(v)
        return out

    def peer(precision: str) -> torch.Tensor:
        with _autocast(precision):
            emb = model.encode_document(
                texts, batch_size=case.batch, convert_to_tensor=True, show_progress_bar=False
            )
        return emb.to_dense().float().cpu()

    fp32, bf16, peer32, peer16 = ours("fp32"), ours("bf16"), peer("fp32"), peer("bf16")
    return {
        "project_bf16_vs_fp32": float((bf16 - fp32).abs().max()),
        "peer_bf16_vs_fp32": float((peer16 - peer32).abs().max()),
        "project_fp32_vs_peer_fp32": float((fp32 - peer32).abs().max()),
    }


def compare_precision(case: EncodeCase, rounds: int = 2) -> PrecisionLine:
    """The encoding in fp32 and bf16, project and peer (sentence-transformers under autocast),
    interleaved."""
    cases = {p: EncodeCase(**{**asdict(case), "precision": p}) for p in ("fp32", "bf16")}
    runs: dict[str, list[float]] = {
        f"{side}_{p}": [] for side in ("project", "peer") for p in cases
    }
    for _ in range(rounds):
        for name in runs:
            side, precision = name.split("_")
            runs[name].append(
                case.texts / cast(Timing, run_side(f"encode-{side}", cases[precision]))["seconds"]
            )
    rate = {n: statistics.median(r) for n, r in runs.items()}
    from sembridge_ray.runtime.placement import native_bf16

    return {
        "comparison": "encode_precision",
        "case": asdict(case),
        "texts_per_s": {n: round(r, 2) for n, r in rate.items()},
        "bf16_over_fp32": round(rate["project_bf16"] / rate["project_fp32"], 3),
        "project_bf16_over_peer_autocast": round(rate["project_bf16"] / rate["peer_bf16"], 3),
        "max_abs_difference": cast(Differences, run_side("encode-diff", case)),
        "native_bf16_cpu": native_bf16(torch.device("cpu")),
        "rounds": rounds,
    }


def compare_encode(case: EncodeCase, rounds: int = 2) -> EncodeLine:
    runs: dict[str, list[Timing]] = {"project": [], "peer": []}
    for _ in range(rounds):
        for name in runs:
            runs[name].append(cast(Timing, run_side(f"encode-{name}", case)))
    rate = {n: statistics.median(case.texts / r["seconds"] for r in rs) for n, rs in runs.items()}
    peak = {n: statistics.median(r["peak_rss_mb"] for r in rs) for n, rs in runs.items()}
    ray_data = cast(RayDataTiming, run_side("encode-raydata", case))
    steady = ray_data["steady_texts_per_s"]
    return {
        "comparison": "encode_documents",
        "case": asdict(case),
        "project": {
            "texts_per_s": round(rate["project"], 2),
            "peak_rss_mb": round(peak["project"], 1),
        },
        "peer": {"texts_per_s": round(rate["peer"], 2), "peak_rss_mb": round(peak["peer"], 1)},
        "throughput_ratio": round(rate["project"] / rate["peer"], 3),
        "peak_memory_ratio": round(peak["project"] / peak["peer"], 3),
        "rounds": rounds,
        "runs_texts_per_s": {
            n: [round(case.texts / r["seconds"], 2) for r in rs] for n, rs in runs.items()
        },
        "ray_data": {
            **ray_data,
            "steady_ratio_to_in_process": steady and round(steady / rate["project"], 3),
            "what": "the evaluate job's encode(): a Ray Data pool of 1 actor; start-up = actor start + model load",
        },
        "mean_tokens": round(mean_tokens(sick_texts(case.texts), case.max_length), 2),
        "project_name": "SparseEncodeUDF (the evaluate job's Ray Data actor), in-process, one staged file",
        "peer_name": "sentence_transformers SparseEncoder.encode_document over the same list",
    }


def compare_init(rows: int = 3000, ref_rows: int = 100, repeats: int = 3) -> InitLine:
    """bridge_weights (α=4, d=384, 30,522 synthetic clustered source rows) vs the bare GEMM and the
    reference loop; and the bundled MiniLM bridge's strings/s on vocabulary pieces (what the init
    stage spends GPU time on)."""
    from benchmarks import bridge_weights as bench
    from sembridge_ray.embed_init.bridge import encode_strings, load_bridge
    from sembridge_ray.sparse.model import load_tokenizer

    new, src = bench.synthetic(rows, 30_522, 384)
    figures = bench.run(new, src, 4.0, ref_rows, None, rows, repeats)
    strings = list(load_tokenizer(resolve(MODEL)).get_vocab())[:2000]
    model = load_bridge("minilm")
    encode_strings(model, strings[:64], 256)
    start = time.perf_counter()
    encode_strings(model, strings, 256)
    figures["bridge_strings_per_s"] = round(len(strings) / (time.perf_counter() - start), 1)
    ms = figures["ms_per_token"]
    return {
        "comparison": "bridge_weights",
        "project": {"ms_per_row": ms["ours"]},
        "peer": {
            "bare_gemm_ms_per_row": ms["bare_gemm"],
            "reference_loop_ms_per_row": ms["reference_loop"],
        },
        "ratio_to_bare_gemm": figures["ratio_to_bare_gemm"],
        "speedup_vs_reference": figures["speedup_vs_reference"],
        "screening_gemm": figures["screening_gemm"],
        "threads": figures["threads"],
        "load_average_1m": figures["load_average_1m"],
        "runs_ratio_to_bare_gemm": figures["runs_ratio_to_bare_gemm"],
        "max_abs_err_vs_float64": figures["max_abs_err_vs_float64"],
        "bridge_strings_per_s": figures["bridge_strings_per_s"],
    }


# a side takes the case its name's prefix picks in CASES
SIDES: dict[str, Callable[[Any], Mapping[str, object]]] = {
    "train-project": train_project,
    "train-peer": train_peer,
    "encode-project": encode_project,
    "encode-peer": encode_peer,
    "encode-raydata": encode_ray_data,
    "encode-diff": encode_differences,
}
CASES: dict[str, type[TrainCase | EncodeCase]] = {"train": TrainCase, "encode": EncodeCase}


def run_side(side: str, case: TrainCase | EncodeCase) -> object:
    """One side in a fresh child process (its own peak RSS), with the case's thread count: what it
    printed, the JSON of that side's record (``SIDES``)."""
    cmd = [sys.executable, "-W", "ignore", "-m", "benchmarks.peers", "--side", side]
    cmd += ["--case", json.dumps(asdict(case))]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=child_env())
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_rate(run: StepTimes, batch: int) -> float:
    return batch / statistics.median(run["step_s"][1:] or run["step_s"])


def compare_train(case: TrainCase, rounds: int = 2) -> TrainLine:
    """Alternate project and peer ``rounds`` times; medians of examples/s and peak RSS, losses step
    by step."""
    runs: dict[str, list[StepTimes]] = {"project": [], "peer": []}
    for _ in range(rounds):
        for name in runs:
            runs[name].append(cast(StepTimes, run_side(f"train-{name}", case)))
    rate = {n: statistics.median(train_rate(r, case.batch) for r in rs) for n, rs in runs.items()}
    peak = {n: statistics.median(r["peak_rss_mb"] for r in rs) for n, rs in runs.items()}
    loss_gap = max(
        abs(a - b)
        for a, b in zip(runs["project"][0]["losses"], runs["peer"][0]["losses"], strict=True)
    )
    return {
        "comparison": "train_step",
        "case": asdict(case),
        "project": {
            "examples_per_s": round(rate["project"], 3),
            "peak_rss_mb": round(peak["project"], 1),
        },
        "peer": {"examples_per_s": round(rate["peer"], 3), "peak_rss_mb": round(peak["peer"], 1)},
        "throughput_ratio": round(rate["project"] / rate["peer"], 3),
        "peak_memory_ratio": round(peak["project"] / peak["peer"], 3),
        "max_loss_gap": loss_gap,
        "losses_project": runs["project"][0]["losses"],
        "rounds": rounds,
        "runs_examples_per_s": {
            n: [round(train_rate(r, case.batch), 3) for r in rs] for n, rs in runs.items()
        },
        "peer_name": "sentence_transformers SparseEncoder + SpladeLoss(SparseMultipleNegativesRankingLoss)",
    }


def run_all(
    train: bool,
    encode: bool,
    retrieval: bool,
    init: bool,
    rounds: int,
    docs: int,
    queries: int,
    skip: frozenset[str] = frozenset(),
) -> Iterator[Mapping[str, object]]:
    """The chosen comparisons' lines (JSON objects, one shape per comparison), each as soon as it is
    measured."""
    from benchmarks.retrieval_peers import compare_corpus

    if train:
        yield compare_train(TrainCase(), rounds)
    if encode:
        yield compare_encode(EncodeCase(), rounds)
        yield compare_precision(EncodeCase(), rounds)
    if init:
        yield compare_init()
    if retrieval:
        for corpus in ("synthetic", "encoder"):
            yield from compare_corpus(corpus, docs, queries, repeats=rounds, skip=skip)


PAPER_DOC_TOKENS, PAPER_PAIR_TOKENS = 256, 64 + 256


def paper_rates(lines: Sequence[Mapping[str, object]]) -> Rates:
    """The project's rates converted to the paper's lengths in proportion to tokens (see
    ``benchmarks.measured``)."""
    rates: Rates = {}
    for line in lines:  # the comparison's name says which line it is
        if line.get("comparison") == "train_step":
            train = cast(TrainLine, line)
            tokens = train["case"]["query_length"] + train["case"]["doc_length"]
            rates["train_examples_per_s"] = (
                train["project"]["examples_per_s"] * tokens / PAPER_PAIR_TOKENS
            )
        elif line.get("comparison") == "encode_documents":
            docs = cast(EncodeLine, line)
            rates["docs_per_s"] = (
                docs["project"]["texts_per_s"] * docs["mean_tokens"] / PAPER_DOC_TOKENS
            )
        elif line.get("comparison") == "bridge_weights":
            rates["bridge_strings_per_s"] = cast(InitLine, line)["bridge_strings_per_s"]
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--side", choices=sorted(SIDES), required=True)
    parser.add_argument("--case", default="{}", help="the case's fields as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    kind = args.side.split("-")[0]
    case = CASES[kind](**json.loads(args.case))
    torch.set_num_threads(case.threads)
    print(json.dumps(SIDES[args.side](case)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
