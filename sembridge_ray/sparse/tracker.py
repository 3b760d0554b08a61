"""Rank 0's TensorBoard event files during fine-tuning (``--tensorboard``; Ray-free)."""

from __future__ import annotations

from collections.abc import Mapping

from sembridge_ray.runtime.errors import InputError


class Tracker:
    """Rank 0's TensorBoard event files (``tensorboard``, an optional dependency): every metric of
    every logged or evaluated step, as a scalar named by its key. A resumed run drops the events
    after its restore step (``purge_step``), so the curves have no doubled segment."""

    def __init__(self, writer: object) -> None:
        self.writer = writer

    @staticmethod
    def require() -> None:
        """An :class:`InputError` when the writer cannot be imported (checked by the driver before
        training; a worker without it says the same)."""
        try:
            import tensorboard  # noqa: F401
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise InputError(
                "--tensorboard needs the tensorboard package: pip install 'sembridge-ray[tensorboard]'"
            ) from None

    @classmethod
    def open(cls, log_dir: str, start: int) -> Tracker:
        cls.require()
        from torch.utils.tensorboard import SummaryWriter

        return cls(SummaryWriter(log_dir=log_dir, purge_step=start + 1 if start else None))

    def write(self, metrics: Mapping[str, float]) -> None:
        step = int(metrics["step"])
        for key, value in metrics.items():
            if key != "step":
                self.writer.add_scalar(key.replace("@", "_at_"), float(value), step)  # type: ignore[attr-defined]
        self.writer.flush()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.writer.close()  # type: ignore[attr-defined]
