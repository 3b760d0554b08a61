"""Where a job's parallel work runs, behind one interface: :class:`LocalExecutor` runs it in this
process; :class:`sembridge_ray.distributed.executor.RayExecutor` on a Ray cluster (Ray Data actor
pools, Ray tasks), handing inputs too small for a pool to a :class:`LocalExecutor`. A job's run is
written against :class:`Executor` (whose methods say what each does) and never imports Ray.

Both run the same callable classes on the same blocks with the same torch thread count, so a
result is the same bit for bit whichever ran it; a training's body is the same function on a Ray
Train worker and in this process, handed a :class:`TrainContext` of where it runs."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.runtime.atomic import atomic_path
from sembridge_ray.runtime.placement import (
    Placement,
    Precision,
    ResourceConfig,
    local_precision,
    plan_placement,
)
from sembridge_ray.runtime.progress import Progress

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
R = TypeVar("R")
T = TypeVar("T")
M = TypeVar("M")


class BlockFn(Protocol):
    """One worker's loaded state: an Arrow block in, an Arrow block out."""

    def __call__(self, batch: pa.Table, /) -> pa.Table: ...


@dataclass(frozen=True, kw_only=True)
class Pool:
    """A pool of workers, one ``udf(**kwargs, **shared)`` each (loaded once, then called per block),
    as many as ``plan`` has, with ``threads`` torch threads each (0: the worker's CPU share).
    ``shared`` holds large read-only objects every worker reads (Ray puts each in its object store
    once). ``udf`` takes a ``device`` keyword: "cpu" in this process, "" (its own pick) on a
    worker."""

    udf: Callable[..., BlockFn]
    kwargs: Mapping[str, object]
    plan: Placement
    threads: int = 0
    shared: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Tasks:
    """How :meth:`Executor.map_tasks` runs its calls: at most ``width`` at once, each given ``cpus``
    CPUs, a failed one retried ``retries`` times; ``shared``: the leading arguments of every call
    (Ray puts each in its object store once)."""

    cpus: float
    width: int
    retries: int = 0
    shared: tuple[object, ...] = ()


def num_rows(table: pa.Table) -> int:
    return int(table.num_rows)


Asked = object
"""A call :meth:`Held.ask` sent, as :meth:`Held.answers` takes it back."""


class Held(Protocol):
    """Objects each held by a worker of its own (``holder(obj)``, built once), asked the same method
    at once: :meth:`ask` sends the call to every worker and returns at once, :meth:`answers` waits
    for the workers' answers, in the objects' order. A worker that dies (Ray) is started again
    from its object and asked again, so the answers are the same."""

    def ask(self, method: str, *args: object) -> Asked:
        """Call ``method(*args)`` on every worker's holder (each argument sent once)."""

    def answers(self, asked: Asked) -> list[object]:
        """The answers to ``asked``, one per object."""

    def shutdown(self) -> None:
        """Stop the workers and let go of the objects."""


class _LocalHeld:
    """The holders in this process: a call is answered when it is asked."""

    def __init__(self, holders: list[object]) -> None:
        self.holders = holders

    def ask(self, method: str, *args: object) -> Asked:
        return [getattr(h, method)(*args) for h in self.holders]

    def answers(self, asked: Asked) -> list[object]:
        return list(cast(list[object], asked))

    def shutdown(self) -> None:
        self.holders = []


class TrainContext(Protocol):
    """Where one training worker runs, as its body sees it: its rank of ``world``, its device, the
    training stream's global batches, the checkpoint the run was restarted from, and the
    checkpoints and metrics it reports. A Ray Train worker's, or this process's (one worker)."""

    rank: int
    world: int
    device: torch.device
    node: str
    """This worker's node (for messages)."""

    def prepare(self, model: M) -> M:
        """The model as this worker trains it (wrapped for data parallelism, on its device)."""

    def batches(self, size: int) -> Iterator[Mapping[str, Sequence[object]]]:
        """The stream's rows as global batches of ``size``, in order: every worker reads every
        batch (and keeps its slice)."""

    def registered(self) -> contextlib.AbstractContextManager[Path | None]:
        """The checkpoint the executor registered for this run (a restart), as a local directory
        while the context is open; None for a fresh run or one in this process."""

    def checkpoint(
        self, metrics: Mapping[str, float], name: str
    ) -> contextlib.AbstractContextManager[Path]:
        """An empty directory for this worker's part of checkpoint ``name``; on leaving the context
        the parts are one checkpoint ``<run_dir>/<name>``, reported with ``metrics``."""

    def report(self, metrics: Mapping[str, float]) -> None:
        """Metrics between checkpoints (dropped where no one collects them)."""


@dataclass(frozen=True, kw_only=True)
class Training:
    """A data-parallel training run (``label`` in the log): ``plan.workers`` workers each run
    ``body(config, context)`` (a module-level function: Ray pickles it) on the global batches of
    ``stream`` (Parquet, in order), checkpointing into ``<storage>/<name>`` (the newest ``keep``
    kept). A failed attempt restarts from its newest checkpoint, at most ``max_failures`` times; an
    error of the input or the environment does not. The trainer's checkpoint rules: ``set_aside``
    (before every attempt) moves damaged ones away; ``newest`` is the newest that verifies."""

    body: Callable[[Mapping[str, object], TrainContext], None]
    config: Mapping[str, object]
    stream: Path
    plan: Placement
    storage: str
    name: str
    keep: int
    max_failures: int
    set_aside: Callable[[str], object]
    newest: Callable[[str], tuple[int, Path] | None]
    label: str = "training"

    @property
    def run_dir(self) -> str:
        return run_dir(self.storage, self.name)


def run_dir(storage: str, name: str) -> str:
    """Where a training named ``name`` keeps its checkpoints under ``storage`` (a path or a URI)."""
    return f"{storage.rstrip('/')}/{name}"


def is_local(path: str | Path) -> bool:
    """Whether ``path`` is on this machine's filesystems (not object storage such as s3://)."""
    return "://" not in str(path)


class Executor(Protocol):
    """What a job's run calls for its parallel work (:class:`LocalExecutor`, ``RayExecutor``)."""

    def start(self) -> None:
        """Fail with one line, before any output is touched, when the executor cannot run."""

    def gpus(self) -> float:
        """The GPUs there are for workers."""

    def placement(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        """The workers ``res`` gets (``reserve``: hold back ``res.reserve_cpus`` for pipeline
        tasks)."""

    def planned(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        """:meth:`placement` as it will be, without starting anything to know it."""

    def precision(self, setting: Precision, res: ResourceConfig, reserve: bool = True) -> Precision:
        """``setting`` as the workers of ``res`` will run it (``auto`` resolved; a CPU is fp32)."""

    def map_blocks(
        self,
        pool: Pool,
        blocks: Sequence[pa.Table],
        size: int,
        progress: Progress,
        count: Callable[[pa.Table], int] = num_rows,
    ) -> list[pa.Table]:
        """Every block through one of ``pool``'s workers, one call per block; the output blocks
        in any order, each counted into ``progress`` by ``count`` as it finishes (``progress``
        finished at the end). ``size``: how many inputs the blocks hold (small inputs may run in
        this process)."""

    def map_tasks(
        self, fn: Callable[..., R], calls: Iterable[tuple[object, ...]], spec: Tasks
    ) -> Iterator[R]:
        """``fn(*spec.shared, *call)`` for every call, as :class:`Tasks` says; the results as they
        finish."""

    def hold(
        self, holder: Callable[[T], object], objects: Iterable[T], size: int, cpus: float
    ) -> Held:
        """A worker per object, holding ``holder(obj)`` (see :class:`Held`) with ``cpus`` CPUs (and
        as many torch threads, at least one); ``size``: how many rows the objects hold (small ones
        may be held in this process). Returns once every worker holds its object."""

    def train(self, training: Training) -> contextlib.AbstractContextManager[Path | None]:
        """Run ``training`` to its end (see :class:`Training`); the final checkpoint it reported, as
        a local directory while the context is open (None where it is ``<run_dir>/<name>`` on a
        path and read from there)."""

    def resume_step(self, training: Training) -> int | None:
        """The step ``training`` would resume from (None: a fresh run). Reads only."""


def use_threads(threads: int) -> None:
    """``threads`` > 0: this worker's torch thread count (see
    ``ResourceConfig.threads_per_worker``)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


@contextlib.contextmanager
def worker_threads(plan: Placement, threads: int) -> Iterator[None]:
    """torch's thread count in this process while it does a worker's work, then put back:
    ``threads`` (``threads_per_worker``) when > 0, else the worker's CPU share, as Ray sets it for
    an actor (OMP_NUM_THREADS)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads if threads > 0 else max(1, int(plan.cpus_per_worker)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LocalExecutor:
    """Everything in this process, on CPU, tasks one after the other. A pool's worker is built for
    its call and kept until a pool of other settings comes, so that a pool called again with the
    same (hashable) settings reuses it: the init job's bridge model, loaded once for both
    vocabularies."""

    def __init__(self) -> None:
        self._last: tuple[object, BlockFn] | None = None

    def start(self) -> None:
        return None

    def gpus(self) -> float:
        return 0.0

    def placement(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        return plan_placement(res, float(os.cpu_count() or 1), 0.0, reserve=reserve)

    planned = placement  # nothing to start

    def precision(self, setting: Precision, res: ResourceConfig, reserve: bool = True) -> Precision:
        return local_precision(setting, use_gpu=False)

    def map_blocks(
        self,
        pool: Pool,
        blocks: Sequence[pa.Table],
        size: int,
        progress: Progress,
        count: Callable[[pa.Table], int] = num_rows,
    ) -> list[pa.Table]:
        out = []
        with worker_threads(pool.plan, pool.threads):
            worker = self._worker(pool)
            for block in blocks:
                out.append(worker(block))
                progress.add(count(out[-1]))
        progress.finish()
        return out

    def _worker(self, pool: Pool) -> BlockFn:
        try:
            key: object = (pool.udf, tuple(sorted(pool.kwargs.items())), pool.threads)
            hash(key)
        except TypeError:
            key = None
        if key is not None and not pool.shared and self._last is not None and self._last[0] == key:
            return self._last[1]
        self._last = None  # the previous worker (a model) freed before the next one loads
        worker = pool.udf(**pool.kwargs, **pool.shared, device="cpu")
        if key is not None and not pool.shared:
            self._last = (key, worker)
        return worker

    def map_tasks(
        self, fn: Callable[..., R], calls: Iterable[tuple[object, ...]], spec: Tasks
    ) -> Iterator[R]:
        for call in calls:
            yield fn(*spec.shared, *call)

    def hold(
        self, holder: Callable[[T], object], objects: Iterable[T], size: int, cpus: float
    ) -> Held:
        """Every holder in this process, with this process's torch threads."""
        return _LocalHeld([holder(obj) for obj in objects])

    def train(self, training: Training) -> contextlib.AbstractContextManager[Path | None]:
        """One worker, this process, torch's thread count the worker's share: the body with a
        :class:`LocalContext`, resumed from the newest checkpoint that verifies. A failure is not
        restarted here (a rerun resumes)."""
        if training.plan.workers != 1 or not is_local(training.run_dir):
            raise ValueError("a training in this process has one worker and checkpoints on a path")
        training.set_aside(training.run_dir)
        log.info("%s in this process (one CPU worker)", training.label)
        with worker_threads(training.plan, 0):
            training.body(training.config, LocalContext(training.stream, Path(training.run_dir)))
        return contextlib.nullcontext()

    def resume_step(self, training: Training) -> int | None:
        point = training.newest(training.run_dir)
        return point[0] if point is not None else None


class LocalContext:
    """The one worker of a training in this process: the stream read in order, checkpoints written
    as Ray Train lays out a one-worker run's (``<run_dir>/<name>``, renamed into place whole)."""

    rank, world, node = 0, 1, "this process"

    def __init__(self, stream: Path, run_dir: Path) -> None:
        import torch

        self.stream, self.run_dir, self.device = stream, run_dir, torch.device("cpu")

    def prepare(self, model: M) -> M:
        return model

    def batches(self, size: int) -> Iterator[Mapping[str, Sequence[object]]]:
        table = pq.read_table(self.stream)
        return (table.slice(i, size).to_pydict() for i in range(0, table.num_rows - size + 1, size))

    def registered(self) -> contextlib.AbstractContextManager[Path | None]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def checkpoint(self, metrics: Mapping[str, float], name: str) -> Iterator[Path]:
        with atomic_path(self.run_dir / name) as tmp:
            tmp.mkdir(parents=True)
            yield tmp

    def report(self, metrics: Mapping[str, float]) -> None:
        return None
