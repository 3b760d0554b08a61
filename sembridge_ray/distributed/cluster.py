"""Connecting to Ray: ``RAY_ADDRESS`` when set (a ``ray job submit`` driver or a user's cluster),
else a local in-process cluster bound to loopback, sized to this machine, and owned by this process:

- its workers see ``RAY_ADDRESS`` of this cluster (a job-level runtime env) and its dashboard runs
  on loopback, registered in this cluster's GCS, so Ray's own helpers that look a cluster up (Ray
  Train's placement-group cleaner) find this one, never another Ray instance of the user on the
  machine;
- it is shut down when the process exits, and every process it started is waited for (killed after
  :data:`REAP_TIMEOUT_S`), so nothing of the job outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import psutil
import ray

from sembridge_ray.runtime.errors import InputError, terminating
from sembridge_ray.runtime.placement import (
    Placement,
    Precision,
    ResourceConfig,
    local_precision,
    plan_placement,
)

log = logging.getLogger(__name__)
REAP_TIMEOUT_S = 15.0
REACH_TIMEOUT_S = 10.0
_owned = False
_announced: set[str] = set()


@dataclass(frozen=True, kw_only=True)
class ClusterInfo:
    cpus: float
    gpus: float
    address: str
    nodes: int = 1


def connect(num_cpus: int | None = None) -> ClusterInfo:
    """Join the cluster at ``RAY_ADDRESS``, or start a local one on 127.0.0.1 that this process
    owns."""
    if not ray.is_initialized():
        quiet = logging.getLogger().getEffectiveLevel() > logging.DEBUG
        level = logging.WARNING if quiet else logging.DEBUG
        setup = {"worker_process_setup_hook": "sembridge_ray.distributed.cluster.setup_worker"}
        address = os.environ.get("RAY_ADDRESS")
        # ray.init replaces it with sys.exit(15); the job's own stays
        sigterm = signal.getsignal(signal.SIGTERM)
        if address:
            require_reachable()
            ray.init(address=address, runtime_env=setup, logging_level=level, log_to_driver=True)
        else:
            _start_local(num_cpus, setup, level)
        # before Ray's own: Ray Data is stopped first (see _stop_datasets)
        atexit.register(shutdown)
        # Put back a Python SIGTERM handler that ray.init replaced (cli.run_job's unwinds the job:
        # lock released, exit 143). Without one (the default action), Ray's stays: it exits through
        # atexit, which shuts the cluster down.
        if callable(sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
        # Ray's own INFO chatter (dataset plans, "0/?" progress, report bookkeeping) demoted to
        # WARNING; Ray Data's progress bars only on a terminal. ``--log-level DEBUG`` keeps all.
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            quiet_ray_data(progress_bars=sys.stderr.isatty())
    return _cluster_info()


def _start_local(num_cpus: int | None, setup: dict[str, str], level: int) -> None:
    """Start the local cluster this process owns (``connect`` without ``RAY_ADDRESS``)."""
    global _owned
    # A fresh local cluster, never an unrelated `ray start` head found in /tmp/ray; it binds to
    # loopback (see sembridge_ray/distributed/__init__.py). Its GCS port is chosen here so the
    # workers can be told. The dashboard (on loopback) serves the state API that Ray Train's
    # placement-group cleaner polls; without it, the cleaner would query whatever listens on the
    # default port. No port is given: Ray then binds the first free one from 8265 on itself. A port
    # picked here and handed over could be taken in between (by this cluster's own agents: CI saw
    # "address already in use", and Ray does not retry a port it was given).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    previous = os.environ.get("RAY_GCS_SERVER_PORT")
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    try:
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            runtime_env={**setup, "env_vars": {"RAY_ADDRESS": f"127.0.0.1:{port}"}},
            logging_level=level,
            log_to_driver=True,
        )
    except Exception as err:  # Ray's start-up failures come as Exception, TimeoutError, ...
        # it could not start (Ray's own start-up timeouts, under heavy load): what it started is
        # stopped, and one line says so (the traceback at DEBUG)
        log.debug("the local Ray cluster did not start", exc_info=True)
        with contextlib.suppress(Exception):
            ray.shutdown()
        _reap()
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(
            f"the local Ray cluster did not start ({type(err).__name__}: {first}); the machine may "
            "be overloaded: run again, or set RAY_ADDRESS to a running cluster"
        ) from err
    finally:
        if previous is None:
            os.environ.pop("RAY_GCS_SERVER_PORT", None)
        else:
            os.environ["RAY_GCS_SERVER_PORT"] = previous
    _owned = True
    _adopt_orphans()


def _cluster_info() -> ClusterInfo:
    """The joined cluster's resources and address, logged the first time this process sees it."""
    res = ray.cluster_resources()
    info = ClusterInfo(
        cpus=res.get("CPU", 0.0),
        gpus=res.get("GPU", 0.0),
        address=ray.get_runtime_context().gcs_address,
        nodes=sum(1 for n in ray.nodes() if n.get("Alive")),
    )
    if info.address not in _announced:
        _announced.add(info.address)
        log.info(
            "Ray cluster at %s: %d node(s), %g CPUs, %g GPUs",
            info.address,
            info.nodes,
            info.cpus,
            info.gpus,
        )
    return info


def quiet_ray_data(progress_bars: bool) -> None:
    """Ray's loggers at WARNING, and Ray Data's progress bars on or off. Ray Data configures its own
    "ray.data" logger (INFO on the console: plans, "0/?" progress) whenever it runs; its documented
    knob is RAY_DATA_LOGGING_CONFIG: the same config with the console at WARNING."""
    from importlib import resources

    for name in ("ray", "ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    config = resources.files("sembridge_ray") / "resources" / "ray_data_logging.yaml"
    os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(config))
    from ray.data._internal.logging import configure_logging
    from ray.util.debug import log_once

    configure_logging()
    # spend the once-only "progress bars disabled" warning
    log_once("ray_data_progress_manager_disabled")
    ray.data.DataContext.get_current().enable_progress_bars = progress_bars


def setup_worker() -> None:
    """Run in every Ray worker of a job (``worker_process_setup_hook``): the same quiet logging as
    the driver, and this project's INFO lines (a training worker's steps) kept."""
    from sembridge_ray.runtime.logs import (
        filter_false_alarm_records,
        project_handler,
        quiet_third_parties,
    )

    quiet_third_parties()
    filter_false_alarm_records()
    # a Ray Data actor's root logger has no handler: its progress lines would be lost
    project_handler()
    # Ray Train v2 logs every report (the whole metrics dict) at INFO, on a logger named by its file
    # path
    try:
        from ray.train.v2._internal.execution import context

        logging.getLogger(context.__file__).setLevel(logging.WARNING)
    except ImportError:
        pass
    logging.getLogger("sembridge_ray").setLevel(logging.INFO)
    quiet_ray_data(progress_bars=False)


QUICK_SHUTDOWN_S = 1.5
"""How long a terminated job (SIGTERM: ``errors.terminating``) waits for Ray's own shutdown before
it kills what is left of a cluster it owns: measured here, a graceful shutdown takes 1.4 s and
waiting for its workers 1 s more (up to 10 s and 15 s on a loaded machine), where a preemption
grants a few seconds."""


def shutdown() -> None:
    """Disconnect; a cluster this process started is shut down and its processes are waited for.
    After a SIGTERM, quickly: every wait bounded (Ray Data's executors, Ray's shutdown), then the
    owned cluster's processes killed."""
    global _owned
    if not ray.is_initialized():
        return
    quick = terminating.is_set()
    _stop_datasets(timeout=QUICK_SHUTDOWN_S if quick else 10.0)
    # Ray's shutdown can wait on processes for seconds: a daemon thread, given a bounded time
    if quick:
        closing = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
        closing.start()
        closing.join(QUICK_SHUTDOWN_S)
    else:
        ray.shutdown()
    if _owned:
        _reap(timeout=0.0 if quick else REAP_TIMEOUT_S)
    _owned = False


def _adopt_orphans() -> None:
    """Make this process the child subreaper of what it starts (Linux ``prctl``): a Ray worker whose
    raylet exits first is re-parented here rather than to init, so the shutdown still finds and
    waits for it. Kept: ``ray.shutdown`` waits only for the processes it started itself (raylet,
    GCS, dashboard: ``Node.kill_all_processes``), not for the raylet's workers."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _stop_datasets(timeout: float = 10.0) -> None:
    """Stop the Ray Data executions still running (a job stopped by SIGTERM or Ctrl-C in the middle
    of a dataset): their scheduling thread would call into Ray after the shutdown, which ends the
    process at once with exit code 1, before the cluster's processes are waited for."""
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    running = [
        t for t in threading.enumerate() if isinstance(t, StreamingExecutor) and t.is_alive()
    ]
    for executor in running:
        executor.shutdown(force=True)
    deadline = time.monotonic() + timeout
    for executor in running:
        executor.join(max(0.0, deadline - time.monotonic()))


def _reap(timeout: float = REAP_TIMEOUT_S) -> None:
    """Wait for the Ray processes below this one to exit (the exited ones re-parented here are
    collected by psutil's wait) and kill the ones still there after ``timeout``: they are this job's
    own cluster's. Other children of the process are left alone."""
    # the live ones that are Ray's (GCS, raylet, dashboard, agents and workers all run code from
    # Ray's package or carry a ``ray::`` title)
    procs = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and "ray" in " ".join(proc.cmdline()):
                procs.append(proc)
    _, left = psutil.wait_procs(procs, timeout=timeout)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    # one unkillable (uninterruptible sleep) is the OS's
    psutil.wait_procs(left, timeout=max(timeout, 1.0))
    if left:  # expected after a SIGTERM (no time for a graceful end), a surprise otherwise
        level = logging.INFO if terminating.is_set() else logging.WARNING
        log.log(level, "killed %d Ray processes of this job that outlived the shutdown", len(left))


def require_reachable(timeout_s: float | None = None) -> None:
    """With ``RAY_ADDRESS`` set, check that something answers there within ``timeout_s`` (default
    :data:`REACH_TIMEOUT_S`; a TCP connect to its host and port, retried), before a job claims its
    output: ``ray.init`` would otherwise retry for minutes. Nothing to check for ``auto``, ``local``
    or an already connected driver. A refusal is one :class:`InputError` line."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if not address or address in ("auto", "local") or ray.is_initialized():
        return
    timeout_s = REACH_TIMEOUT_S if timeout_s is None else timeout_s
    host, port = address_endpoint(address)
    deadline, last = time.monotonic() + timeout_s, ""
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as err:
            last = err.strerror or type(err).__name__
        if time.monotonic() >= deadline:
            raise InputError(
                f"RAY_ADDRESS={address}: no Ray cluster answers at {host}:{port} ({last}, {timeout_s:g} s); start it "
                "or unset RAY_ADDRESS to run on a private local cluster"
            )
        time.sleep(0.5)


def address_endpoint(address: str) -> tuple[str, int]:
    """``host:port``, ``ray://host:port`` or ``http(s)://host:port`` -> (host, port); the ports Ray
    defaults to (GCS 6379, client 10001, dashboard 8265) when none is given."""
    scheme, rest = address.split("://", 1) if "://" in address else ("", address)
    default = {"ray": 10001, "http": 8265, "https": 443}.get(scheme, 6379)
    hostport = rest.split("/", 1)[0]
    host, colon, port = hostport.rpartition(":")
    if not colon or not port.isdigit():
        return hostport.strip("[]"), default
    return host.strip("[]"), int(port)


# cluster address -> whether its GPU workers compute bf16 (probed once)
_BF16_GPUS: dict[str, bool] = {}


def resolve_precision(setting: Precision, res: ResourceConfig, reserve: bool = True) -> Precision:
    """A job's ``precision`` as its workers will run it: ``auto`` is bf16 when they get CUDA GPUs
    that support bf16, fp32 otherwise (CPUs always: results must not depend on a CPU feature); fp32
    and bf16 stay. Without ``RAY_ADDRESS`` the cluster is this machine's, so nothing starts for the
    answer; on a joined cluster one tiny GPU task asks a worker. A bf16 choice, or one a joined
    cluster answered, is logged."""
    if setting != "auto" or res.gpus_per_worker == 0:
        return "fp32" if setting == "auto" else setting
    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        import torch

        chosen: Precision = local_precision(setting, torch.cuda.is_available())
    else:
        # plan_placement, not placement(): its "the cluster fits fewer" line comes with the work
        info = connect()
        plan = plan_placement(res, info.cpus, info.gpus, reserve=reserve)
        chosen = "bf16" if plan.use_gpu and _gpus_have_bf16(plan.gpus_per_worker) else "fp32"
    level = logging.INFO if chosen == "bf16" or os.environ.get("RAY_ADDRESS") else logging.DEBUG
    log.log(
        level,
        "precision auto: %s (%s)",
        chosen,
        "CUDA GPUs with bf16" if chosen == "bf16" else "no bf16 GPU",
    )
    return chosen


def _gpus_have_bf16(gpus: float) -> bool:
    address = ray.get_runtime_context().gcs_address
    if address not in _BF16_GPUS:

        @ray.remote(num_gpus=gpus, num_cpus=0)
        def probe() -> bool:
            import torch

            return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())

        _BF16_GPUS[address] = bool(ray.get(probe.remote()))
    return _BF16_GPUS[address]


IN_DRIVER_ROWS = int(os.environ.get("SEMBRIDGE_IN_DRIVER_ROWS", "2000"))
"""Inputs of at most this many rows (texts, documents, queries, token strings) are computed in the
driver's process on CPU (:func:`in_driver`): a Ray actor would cost more to start (a process,
torch's imports, the model: seconds each) than the work. ``SEMBRIDGE_IN_DRIVER_ROWS=0`` keeps small
inputs on actors (the fault-injection tests)."""


def in_driver(plan: Placement, rows: int) -> bool:
    """Whether a stage of ``rows`` inputs planned as ``plan`` runs in this process instead of in Ray
    actors: never with GPUs; on CPU when the input is small (:data:`IN_DRIVER_ROWS`), or when
    ``plan`` is one worker on a one-node cluster and this process is the job's driver (a cell run as
    a Ray task beside others keeps its actors, whose CPUs Ray reserves). The driver runs the actors'
    code on the same batches with their torch thread count (``runtime.executor.worker_threads``), so the results
    are the actors' bit for bit."""
    return not plan.use_gpu and (rows <= IN_DRIVER_ROWS or driver_is_the_worker(plan))


def driver_is_the_worker(plan: Placement) -> bool:
    """Whether ``plan`` is one CPU worker on a one-node cluster whose driver is this process: then
    this process does the worker's work itself, with the worker's torch thread count, for the same
    result without starting one (a cell run as a Ray task beside others keeps its workers)."""
    return (
        not plan.use_gpu
        and plan.workers == 1
        and connect().nodes == 1
        and ray.get_runtime_context().worker.mode == ray.SCRIPT_MODE
    )


def expected_placement(res: ResourceConfig, reserve: bool = True) -> Placement:
    """:func:`placement` as it will be, without starting a local cluster to know it: the connected
    or joined cluster's, else this machine's (the local cluster :func:`connect` starts has its CPUs
    and GPUs)."""
    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return placement(res, reserve)
    import torch

    gpus = float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0
    return plan_placement(res, float(os.cpu_count() or 1), gpus, reserve=reserve)


def placement(res: ResourceConfig, reserve: bool = True) -> Placement:
    """Plan workers against the connected cluster (connecting first when needed). Fewer workers
    (or no GPU) than ``res`` asks for is said once per process: a warning, or an info line when
    ``res`` is the default (a number the user never gave)."""
    info = connect()
    plan = plan_placement(res, info.cpus, info.gpus, reserve=reserve)
    fewer = plan.workers < res.workers or (res.gpus_per_worker and not plan.use_gpu)
    if fewer and (res, plan) not in _fitted:
        _fitted.add((res, plan))
        default = ResourceConfig()
        chosen = (res.workers, res.gpus_per_worker) != (default.workers, default.gpus_per_worker)
        log.log(
            logging.WARNING if chosen else logging.INFO,
            "%s %d workers (gpus/worker %s); the cluster fits %s",
            "asked for" if chosen else "the default of",
            res.workers,
            res.gpus_per_worker,
            plan,
        )
    return plan


_fitted: set[tuple[ResourceConfig, Placement]] = set()
"""The (resources, placement) pairs already said by :func:`placement`."""
