from __future__ import annotations

import pytest

from sembridge_ray.placement import ResourceConfig, plan_placement


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
