"""Which config class each job's presets (``jobs/configs/<job>_<name>.yaml``) build."""

from __future__ import annotations

import importlib
from pathlib import Path

from sembridge_ray.config import Config, load_preset, merge

PRESET_DIR = Path(__file__).resolve().parent.parent / "jobs" / "configs"
JOB_CONFIGS = {
    "init": "sembridge_ray.embed_init.config:InitConfig",
    "finetune": "sembridge_ray.sparse.config:FinetuneConfig",
    "evaluate": "sembridge_ray.retrieval.config:EvaluateConfig",
    "malstm": "sembridge_ray.siamese.config:MalstmConfig",
    "reproduce": "sembridge_ray.reproduce.config:ReproduceConfig",
}


def config_class(job: str) -> type[Config]:
    module, _, name = JOB_CONFIGS[job].partition(":")
    return getattr(importlib.import_module(module), name)


def load_preset_file(path: Path) -> Config:
    """Build the config a preset file describes (its job is the file name's prefix before ``_``)."""
    cls = config_class(Path(path).stem.split("_", 1)[0])
    return cls.from_dict(merge(cls().to_dict(), load_preset(Path(path))))
