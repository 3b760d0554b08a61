"""Precision is a setting, never a CPU feature: with native bf16 forced on and off, every default
path computes the same fp32 numbers; ``precision=bf16`` is a different run (fingerprint, caches)
that the caller asks for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from sembridge_ray.embed_init import weighting
from sembridge_ray.embed_init.baselines import method_weights
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.runtime import placement
from sembridge_ray.runtime.placement import ResourceConfig, local_precision
from sembridge_ray.sparse.encode import encode_texts

TEXTS = [
    "a man is playing a guitar on a stage in front of a large crowd of people",
    "the dog runs",
    "two kids are sitting on a bench in the park and eating ice cream together",
    "a cat sleeps on the warm windowsill",
]


@pytest.fixture(params=[True, False], ids=["native-bf16", "no-native-bf16"])
def cpu_feature(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both kinds of CPU, whichever this one is: AVX512-BF16/AMX reported present, then absent."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: request.param)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: request.param)
    assert placement.native_bf16(torch.device("cpu")) is request.param
    return bool(request.param)


@pytest.fixture(scope="module")
def encoder(fixtures_root: Path):
    from sembridge_ray.sparse.model import load_sparse_encoder

    return load_sparse_encoder(str(fixtures_root / "bert-mlm"), max_length=256)


def dense(indices: list[np.ndarray], values: list[np.ndarray], vocab: int) -> np.ndarray:
    out = np.zeros((len(indices), vocab), np.float32)
    for row, (i, v) in enumerate(zip(indices, values, strict=True)):
        out[row, i] = v
    return out


def test_the_default_encoding_equals_fp32_encode_document_on_any_cpu(
    encoder, cpu_feature: bool
) -> None:
    expected = encoder.encode_document(TEXTS, convert_to_tensor=True).to_dense().numpy()
    ours = dense(*encode_texts(encoder, TEXTS, 2, role="document"), expected.shape[1])
    assert np.abs(ours - expected).max() < 1e-5


def test_bf16_is_asked_for_and_gives_other_vectors(encoder, cpu_feature: bool) -> None:
    fp32 = dense(
        *encode_texts(encoder, TEXTS, 2, role="document"), encoder.get_embedding_dimension()
    )
    bf16 = dense(*encode_texts(encoder, TEXTS, 2, role="document", precision="bf16"), fp32.shape[1])
    assert 0 < np.abs(bf16 - fp32).max() < 0.5 * fp32.max()  # rounded matmuls: close, not equal
    with pytest.raises(ValueError, match="once resolved"):
        encode_texts(encoder, TEXTS, 2, precision="auto")


def test_the_default_screening_is_fp32_on_any_cpu(cpu_feature: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    new, src = torch.randn(40, 16, generator=gen), torch.randn(300, 16, generator=gen)
    ids = torch.arange(300)
    default = method_weights(
        "sembridge", InitConfig().weighting, new, src, ids, ids, precision="fp32"
    )
    forced = weighting.bridge_weights(new, src, 4.0, screen=torch.float32)
    assert torch.equal(default.to_dense(), forced.to_dense())
    assert weighting.screen_dtype() == torch.float32


@pytest.mark.parametrize("cls", [EvaluateConfig, InitConfig, FinetuneConfig])
def test_precision_is_part_of_the_identity(cls: type) -> None:
    fp32, bf16 = cls(precision="fp32"), cls(precision="bf16")
    assert fp32.identity("job", {}).fingerprint != bf16.identity("job", {}).fingerprint


def test_auto_is_bf16_only_on_cuda_gpus_that_support_it(
    monkeypatch: pytest.MonkeyPatch, cpu_feature: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_precision("auto", use_gpu=False) == "fp32"  # whatever the CPU offers
    assert local_precision("auto", use_gpu=True) == "fp32"  # no CUDA device after all
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert local_precision("auto", use_gpu=True) == "fp32"  # e.g. a V100
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert (
        local_precision("auto", use_gpu=True) == "bf16"
        and local_precision("auto", use_gpu=False) == "fp32"
    )
    assert (
        local_precision("bf16", use_gpu=False) == "bf16"
        and local_precision("fp32", use_gpu=True) == "fp32"
    )


def test_the_driver_resolves_auto_on_a_cpu_machine_without_starting_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sembridge_ray.distributed import cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cluster.resolve_precision("auto", ResourceConfig()) == "fp32"
    assert cluster.resolve_precision("bf16", ResourceConfig()) == "bf16"
    assert not cluster.ray.is_initialized()


def test_the_former_bf16_flag_still_reads() -> None:
    from sembridge_ray.cli import parse_config
    from sembridge_ray.recipes.finetune.config import FLAGS

    assert (
        parse_config(FinetuneConfig, ["--bf16", "off"], flags=FLAGS, job="finetune")[0].precision
        == "fp32"
    )
    assert FinetuneConfig.from_dict({"optim": {"bf16": "on"}}).precision == "bf16"
    assert replace(FinetuneConfig(), precision="auto").precision == "auto"
