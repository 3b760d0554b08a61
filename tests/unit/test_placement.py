from __future__ import annotations

import logging

import pytest

from sembridge_ray.runtime.placement import ResourceConfig, plan_placement


@pytest.mark.parametrize(
    ("res", "cpus", "gpus", "expected"),
    [
        (ResourceConfig(workers=4), 2, 0, (1, 0.0)),  # one CPU held back for Ray Data reads
        (ResourceConfig(workers=4, reserve_cpus=0), 2, 0, (2, 0.0)),
        (ResourceConfig(workers=4), 16, 2, (2, 1.0)),  # GPUs by default when present
        (ResourceConfig(workers=2, gpus_per_worker=0), 16, 2, (2, 0.0)),  # CPU when asked
        # asked for GPUs, none: CPU fallback
        (ResourceConfig(workers=2, gpus_per_worker=1), 8, 0, (2, 0.0)),
        (ResourceConfig(workers=8, gpus_per_worker=0.5), 8, 2, (4, 0.5)),
        (ResourceConfig(workers=2), 1, 0, (1, 0.0)),  # never zero workers
    ],
)
def test_plan_placement(
    res: ResourceConfig, cpus: float, gpus: float, expected: tuple[int, float]
) -> None:
    plan = plan_placement(res, cpus, gpus)
    assert (plan.workers, plan.gpus_per_worker) == expected
    assert plan.use_gpu == (expected[1] > 0)


def test_train_needs_no_reserve() -> None:
    assert plan_placement(ResourceConfig(workers=2), 2, 0, reserve=False).workers == 2


@pytest.mark.parametrize(
    ("res", "level"),
    [
        (ResourceConfig(), logging.INFO),  # the default: a number the user never gave
        (ResourceConfig(workers=3), logging.WARNING),
        (ResourceConfig(gpus_per_worker=1), logging.WARNING),  # no GPU: CPU instead
    ],
)
def test_fewer_workers_than_asked_are_a_warning_once_and_the_defaults_an_info_line(
    res: ResourceConfig,
    level: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every default run on 2 CPUs warned "asked for 2 workers" (issue 42, point 12), twice."""
    from sembridge_ray.distributed import cluster

    monkeypatch.setattr(
        cluster, "connect", lambda: cluster.ClusterInfo(cpus=2, gpus=0, address="x")
    )
    monkeypatch.setattr(cluster, "_fitted", set(), raising=False)
    with caplog.at_level(logging.INFO, logger=cluster.__name__):
        plans = {cluster.placement(res) for _ in range(2)}
    assert plans == {plan_placement(res, 2, 0)}
    (record,) = [r for r in caplog.records if "the cluster fits" in r.getMessage()]
    assert record.levelno == level
    assert ("asked for" in record.getMessage()) == (level == logging.WARNING)
