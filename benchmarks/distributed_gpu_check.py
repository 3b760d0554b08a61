"""The prepared GPU check's driver: every stage of a cell on the smoke presets' bundled assets
(MiniLM SPLADE, the SICK-based miniature), through the same Ray drivers the jobs use, timed, and
compared with the CPU.

    main pass (this process, ``device``):  init -> evaluate zero-shot -> fine-tune (fp32, bf16; 1 then 2 workers)
                                            -> evaluate the bf16 1-worker model
    CPU reference (a child process that sees no GPU, ``CUDA_VISIBLE_DEVICES=""``): init again; evaluate the main
                                            pass's two models on the CPU

The CPU reference runs in its own process with its own Ray cluster: in one cluster, a Ray actor that
asks for no GPU still sees every GPU (Ray leaves ``CUDA_VISIBLE_DEVICES`` alone for it), and would
compute on one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

import pyarrow.parquet as pq

from benchmarks import ROOT
from benchmarks import gpu_check as gc
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.json_types import JSONValue
from sembridge_ray.recipes import PRESET_DIR, load_preset_file
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.runtime.placement import ResourceConfig

if TYPE_CHECKING:
    from sembridge_ray.runtime.config import Config

log = logging.getLogger(__name__)
REFERENCE, MODELS = "reference.json", "models.json"
MODEL_NAME = "all-MiniLM-L6-v2 SPLADE (bundled minilm-splade) on SICK"
BUDGET_S = 300.0
C = TypeVar("C", bound="Config")


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    device: str = "cuda"
    """cuda: the check; cpu: the same stages on the CPU (the CPU reference, or a dry run of the
    whole check)."""
    output: Path = Path("outputs/gpu_check")
    """Root of every stage's output (``<device>/<stage>``); the check's own subdirectories are
    replaced."""
    pairs: int | None = None
    """SICK pairs per split in the retrieval set (None: all of SICK, 4,927 test pairs)."""
    steps: int = 20
    """Fine-tuning steps per run."""
    batch_size: int = 32
    """Global fine-tuning batch."""
    max_workers: int = 2
    """Fine-tuning runs with 1, then (when the machine has them) up to this many workers."""
    reference_for: Path | None = None
    """CPU reference mode: the main pass's directory whose models are evaluated here."""
    source_model: str = ""
    """Init's source encoder ('': the smoke preset's bundled MiniLM SPLADE); a dry run may pass tiny
    test fixtures (``python -m sembridge_ray.testing --out DIR``) here and below."""
    target_tokenizer: str = ""
    """Init's target tokenizer ('': the preset's bundled sick-bpe)."""
    bridge_model: str = ""
    """Init's bridge model ('': the preset's bundled all-MiniLM-L6-v2)."""

    def asset_args(self) -> list[str]:
        """The command-line flags that pass the asset overrides on to the CPU reference."""
        names = {"--model": self.source_model, "--target-tokenizer": self.target_tokenizer}
        names["--bridge-model"] = self.bridge_model
        return [arg for flag, value in names.items() if value for arg in (flag, value)]


class GpuMemory:
    """Samples ``nvidia-smi`` in a thread while a stage runs: peak MiB in use on the busiest GPU,
    and whether any process computed on a GPU (a compute app listed, or memory in use grew by more
    than 64 MiB)."""

    def __init__(self, enabled: bool = True, every_s: float = 0.25) -> None:
        self.enabled, self.every_s, self.apps = (
            enabled and shutil.which("nvidia-smi") is not None,
            every_s,
            False,
        )
        self.peak: float | None = None
        self.base: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _query(self, *args: str) -> list[str] | None:
        try:
            cmd = ["nvidia-smi", *args, "--format=csv,noheader,nounits"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _run(self) -> None:
        while not self._stop.is_set():
            used = self._query("--query-gpu=memory.used")
            if used:
                now = max(float(v) for v in used)
                self.base = now if self.base is None else self.base
                self.peak = now if self.peak is None else max(self.peak, now)
            self.apps = self.apps or bool(self._query("--query-compute-apps=pid"))
            self._stop.wait(self.every_s)

    @property
    def used_gpu(self) -> bool:
        grew = self.peak is not None and self.base is not None and self.peak - self.base > 64
        return self.apps or grew

    def __enter__(self) -> GpuMemory:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class StageBox(TypedDict, total=False):
    """What :func:`timed` measured, filled in when its block ends."""

    wall_s: float
    peak_gpu_mem_mib: float | None


@contextmanager
def timed(device: str, stage: str) -> Iterator[StageBox]:
    """Times the block and samples GPU memory; on a CUDA pass, asserts that the stage computed on a
    GPU."""
    box: StageBox = {}
    start = time.perf_counter()
    with GpuMemory(enabled=device == "cuda") as mem:  # a CPU pass on a GPU machine measures no GPU
        yield box
    box["wall_s"] = round(time.perf_counter() - start, 2)
    box["peak_gpu_mem_mib"] = mem.peak
    if device == "cuda" and not mem.used_gpu:
        raise RuntimeError(
            f"stage {stage}: no process computed on a GPU while it ran (device asserted CUDA)"
        )


def preset(cls: type[C], name: str) -> C:
    cfg = load_preset_file(PRESET_DIR / f"{name}.yaml")
    assert isinstance(cfg, cls)
    return cfg


def resources(base: ResourceConfig, device: str, workers: int = 1) -> ResourceConfig:
    """One GPU per worker on a CUDA pass; on the CPU, the machine's cores shared among the workers'
    torch threads."""
    if device == "cuda":
        return replace(base, workers=workers, gpus_per_worker=1.0)
    threads = max(1, (os.cpu_count() or 2) // workers)
    return replace(base, workers=workers, gpus_per_worker=0.0, threads_per_worker=threads)


def init_stage(check: CheckConfig, out: Path) -> gc.Measured:
    base = preset(InitConfig, "init_smoke")
    # fresh, so the bridge strings are encoded (and timed), never read back
    cache = out / "bridge-cache"
    cfg = replace(  # an asset the check names replaces the preset's
        base,
        source_model=check.source_model or base.source_model,
        target_tokenizer=check.target_tokenizer or base.target_tokenizer,
        bridge_model=check.bridge_model or base.bridge_model,
    )
    cfg = replace(
        cfg,
        output=str(out / "init"),
        cache_dir=str(cache),
        overwrite=True,
        samples=0,
        precision="fp32",
    )
    cfg = replace(cfg, resources=resources(base.resources, check.device))
    from sembridge_ray.recipes.init.run import run_init

    with timed(check.device, "init") as box:
        result = run_init(cfg, executor=RayExecutor())
    strings = sum(pq.ParquetFile(p).metadata.num_rows for p in cache.glob("[!.]*/vectors.parquet"))
    rate = strings / max(result.timings.get("bridge_encode_s", 0.0), 1e-9)
    line = stage_line("init", check.device, "float32", box, rate, {"bridge_strings": strings})
    return gc.Measured(line=line, model=Path(result.model))


def evaluate_stage(
    check: CheckConfig, stage: str, model: Path, dataset: Path, out: Path
) -> gc.Measured:
    base = preset(EvaluateConfig, "evaluate_smoke")
    cfg = replace(
        base, model=str(model), dataset=str(dataset), output=str(out / stage), overwrite=True
    )
    # fp32, as labelled: the comparison is with the CPU's nDCG@10; bf16 is checked on the training
    # curves
    cfg = replace(cfg, resources=resources(base.resources, check.device), precision="fp32")
    from sembridge_ray.recipes.evaluate.run import run_evaluate

    with timed(check.device, stage) as box:
        result = run_evaluate(cfg, executor=RayExecutor())
    rate = result.num_docs / max(result.metrics["seconds"]["encode_docs"], 1e-9)
    extra: dict[str, JSONValue] = {
        "nDCG@10": result.ndcg_at_10,
        "num_docs": result.num_docs,
        "model": str(model),
    }
    return gc.Measured(
        line=stage_line(stage, check.device, "float32", box, rate, extra),
        model=model,
        ndcg=result.ndcg_at_10,
    )


def finetune_stage(
    check: CheckConfig, stage: str, model: Path, dataset: Path, out: Path, workers: int, bf16: bool
) -> gc.Measured:
    base = preset(FinetuneConfig, "finetune_smoke")
    optim = replace(base.optim, max_steps=check.steps, batch_size=check.batch_size)
    cfg = replace(
        base,
        model=str(model),
        train=str(dataset),
        output=str(out / stage),
        overwrite=True,
        log_every=1,
        checkpoint_every=check.steps,
        optim=optim,
        precision="bf16" if bf16 else "fp32",
        resources=resources(base.resources, check.device, workers),
    )
    from sembridge_ray.recipes.finetune.run import run_finetune

    with timed(check.device, stage) as box:
        result = run_finetune(cfg, executor=RayExecutor())
    history = [
        json.loads(s)
        for s in (out / stage / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    # the first step pays for warm-up
    rates = sorted(m["examples_per_s"] for m in history[1:]) or [0.0]
    extra: dict[str, JSONValue] = {
        "steps": result.steps,
        "workers": workers,
        "final_loss": history[-1]["loss"] if history else None,
    }
    dtype = "bfloat16 autocast" if bf16 else "float32"
    line = stage_line(stage, check.device, dtype, box, rates[len(rates) // 2], extra)
    return gc.Measured(
        line=line, model=Path(result.model), losses=tuple(m["loss"] for m in history)
    )


def stage_line(
    stage: str, device: str, dtype: str, box: StageBox, rate: float, extra: dict[str, JSONValue]
) -> gc.StageLine:
    unit = gc.THROUGHPUT_UNITS[stage.split("_")[0]]
    return gc.StageLine(
        stage=stage,
        device=device,
        dtype=dtype,
        wall_s=box["wall_s"],
        throughput=round(rate, 1),
        throughput_unit=unit,
        peak_gpu_mem_mib=box["peak_gpu_mem_mib"],
        extra=extra,
    )


def retrieval_set(check: CheckConfig, root: Path) -> Path:
    """The SICK retrieval set (BEIR layout: test qrels to evaluate, train qrels to fine-tune)."""
    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.resources import sick_dir

    return write_sick_beir(sick_dir(), root / "sick", limit=check.pairs)


def fresh(path: Path) -> Path:
    """The check's own directory, emptied (it holds nothing but what an earlier check wrote)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def main_pass(check: CheckConfig, gpus: int) -> list[gc.Measured]:
    """Every stage on ``check.device``; fine-tuning with 2 workers only where there are 2 GPUs (or
    on the CPU)."""
    out = fresh(check.output / check.device)
    data = retrieval_set(check, out)
    init = init_stage(check, out)
    assert init.model is not None
    done = [init, evaluate_stage(check, "evaluate_zero_shot", init.model, data, out)]
    many = min(check.max_workers, gpus) if check.device == "cuda" else check.max_workers
    for workers in sorted({1, many}):
        for bf16 in (False, True):
            stage = f"finetune_{workers}w_{'bf16' if bf16 else 'fp32'}"
            done.append(finetune_stage(check, stage, init.model, data, out, workers, bf16))
    tuned = next(m.model for m in done if m.line.stage == "finetune_1w_bf16")
    assert tuned is not None
    done.append(evaluate_stage(check, "evaluate_finetuned", tuned, data, out))
    models = {m.line.stage: str(m.model) for m in done if m.line.stage.startswith("evaluate")}
    # what the CPU reference evaluates
    (out / MODELS).write_text(json.dumps(models, indent=2), encoding="utf-8")
    return done


def reference_pass(check: CheckConfig) -> gc.Reference:
    """The CPU reference for a main pass in ``check.reference_for``: init again, and evaluate its
    two models."""
    assert check.reference_for is not None
    main = check.reference_for
    out = fresh(check.output / "cpu-reference")
    init = init_stage(check, out)
    models = json.loads((main / MODELS).read_text(encoding="utf-8"))
    evals = {
        stage: evaluate_stage(check, stage, Path(model), main / "sick", out)
        for stage, model in models.items()
    }
    ref: gc.Reference = {
        "init_model": str(init.model),
        # evaluate stages have one
        "ndcg": {stage: m.ndcg for stage, m in evals.items() if m.ndcg is not None},
        "lines": [json.loads(m.line.to_json()) for m in (init, *evals.values())],
    }
    (out / REFERENCE).write_text(json.dumps(ref, indent=2), encoding="utf-8")
    return ref


def run_reference(check: CheckConfig, main: Path) -> gc.Reference:
    """The CPU reference in a child process that sees no GPU (and starts its own Ray cluster)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TORCH_DEVICE")}
    env |= {"CUDA_VISIBLE_DEVICES": "", "TORCH_DEVICE": "cpu"}
    cmd = [
        sys.executable,
        "-m",
        "jobs.gpu_check",
        "--device",
        "cpu",
        "--reference-for",
        str(main),
        "--output",
        str(check.output),
        "--pairs",
        str(check.pairs or 0),
        *check.asset_args(),
    ]
    log.info("CPU reference: %s", " ".join(cmd))
    subprocess.run(cmd, env=env, check=True, cwd=ROOT)
    return cast(
        gc.Reference,
        json.loads((check.output / "cpu-reference" / REFERENCE).read_text(encoding="utf-8")),
    )


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    lines: list[gc.StageLine]
    figures: gc.GpuFigures
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(line.compare is None or line.compare.ok for line in self.lines)


def run_gpu_check(check: CheckConfig, gpu_names: list[str]) -> CheckResult | None:
    """The check (main pass, then the CPU reference in a child process, then the comparisons); in
    reference mode only the reference pass (returns None)."""
    if check.reference_for is not None:
        reference_pass(check)
        return None
    start = time.perf_counter()
    info = cluster.connect()
    if check.device == "cuda" and info.gpus < 1:
        raise RuntimeError(
            "Ray finds no GPU on this machine, although the check was asked to run on CUDA"
        )
    done = main_pass(check, int(info.gpus))
    cluster.shutdown()  # its CPUs go to the CPU reference
    ref = run_reference(check, check.output / check.device)
    lines = gc.with_comparisons(done, ref)
    wall = time.perf_counter() - start
    if wall > BUDGET_S:
        log.warning("the check took %.0f s, over its %.0f s budget", wall, BUDGET_S)
    gpu = gpu_names[0] if gpu_names else "none (CPU)"
    model = " ".join(check.asset_args()) or MODEL_NAME  # a dry run on other assets says which
    return CheckResult(
        lines=lines, figures=gc.measured_figures(lines, gpu, len(gpu_names), model), wall_s=wall
    )


def report_gpu_check(check: CheckConfig, figures: Path | None = None) -> int:
    """The command: run the check, print one JSON line per stage (stdout), write the measured
    figures (to ``figures``, default ``figures.json`` beside the outputs: ``reproduce --dry-run
    --figures`` reads it). 0 when every comparison holds."""
    gpus = gc.nvidia_gpus() if check.device == "cuda" else []
    if check.device == "cuda" and not gc.cuda_ready():
        raise RuntimeError(f"nvidia-smi lists {gpus or 'no GPU'}, but this torch cannot use CUDA")
    result = run_gpu_check(check, gpus)
    if result is None:  # the CPU reference's child process
        return 0
    for line in result.lines:
        print(line.to_json(), flush=True)
    target = figures or check.output / "figures.json"
    gc.write_figures(result.figures, target)
    print(
        f"# {len(result.lines)} stages in {result.wall_s:.0f} s; measured figures: {target} "
        f"(reproduce --dry-run --figures {target})",
        file=sys.stderr,
    )
    return 0 if result.ok else 1
