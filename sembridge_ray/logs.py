"""One logging setup for every process of a job: the command line, the Ray drivers and every Ray worker.

``setup_logging`` gives the format every log line has (``LOG_FORMAT``) and demotes third-party noise that says
nothing a user of these jobs can act on (hub progress bars, model-load reports, beta-feature warnings).
"""

from __future__ import annotations

import logging
import os
import warnings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Third-party messages that say nothing a user of these jobs can act on.
_QUIET_LOGGERS = (
    "transformers",
    "sentence_transformers",
    "huggingface_hub",
    "datasets",
    "filelock",
    "urllib3",
    "matplotlib",
    "PIL",
)
_QUIET_WARNINGS = (
    "Sparse CSR tensor support is in beta",
    "The given NumPy array is not writable",
    "Converting a tensor with requires_grad",
    "TypedStorage is deprecated",
    # its replacement (torch.distributed._functional_collectives) is private; the autograd gather still works
    "torch.distributed.nn.functional.all_gather is deprecated",
)


def quiet_third_parties() -> None:
    """Demote known third-party noise (hub progress bars, model-load reports, beta-feature warnings) to WARNING."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for text in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{text}.*")


def setup_logging(level: str | int = "INFO", force: bool = True) -> None:
    """The job's root logger at ``level`` with :data:`LOG_FORMAT`, and third parties quietened."""
    numeric = getattr(logging, level) if isinstance(level, str) else level
    logging.basicConfig(level=numeric, format=LOG_FORMAT, force=force)
    quiet_third_parties()
