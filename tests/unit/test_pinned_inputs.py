"""An input replaced or edited while a run reads it fails the run: nothing of it is marked complete
and nothing computed from the new input is cached under the old one's key (issue 33, point 2). No
Ray: the init job in-process and the identity check itself; the evaluate and fine-tune drivers are
in ``tests/ray/test_pinned_inputs.py``."""

from __future__ import annotations

import ast
import inspect
import os
import shutil
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from sembridge_ray.embed_init.pipeline import Stages
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise, local_stages
from sembridge_ray.runtime.identity import InputChanged, path_identity, require_unchanged
from sembridge_ray.runtime.outputs import SUCCESS


def init_output(fixtures_root: Path, out: Path, cache: Path, **settings: object) -> Path:
    """A finished init output of the tiny fixtures (its ``model/`` is what later jobs read)."""
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(out),
        cache_dir=str(cache),
        samples=0,
    ).with_settings(**settings)
    initialise(cfg)
    return out


def overwrite_swap(out: Path, new: Path) -> None:
    """What an ``--overwrite`` of ``out`` does at its end: the finished new run renamed in, the old
    one removed."""
    old = out.with_name(out.name + ".overwrite-previous")
    os.rename(out, old)
    os.rename(new, out)
    shutil.rmtree(old)


def test_a_project_output_replaced_since_it_was_identified_is_named(
    fixtures_root: Path, tmp_path: Path
) -> None:
    a = init_output(fixtures_root, tmp_path / "a", tmp_path / "cache")
    b = init_output(fixtures_root, tmp_path / "b", tmp_path / "cache", alpha=2.0)
    recorded = {"model": path_identity(a / "model"), "hub": "hub:model:org/x@1"}
    # unchanged; a hub id is not checked
    require_unchanged(recorded, {"model": str(a / "model"), "hub": "org/x"})
    overwrite_swap(a, b)
    with pytest.raises(
        InputChanged,
        match=r"input model .*/a/model changed while this run was reading it \(it was ",
    ):
        require_unchanged(recorded, {"model": str(a / "model")})


def test_a_bridge_model_edited_while_it_encodes_fails_the_init_and_caches_nothing(
    fixtures_root: Path, tmp_path: Path
) -> None:
    bridge = tmp_path / "bridge"
    shutil.copytree(fixtures_root / "bridge", bridge)
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(bridge),
        output=str(tmp_path / "out"),
        cache_dir=str(tmp_path / "cache"),
        precision="fp32",
    )
    stages = local_stages(cfg)

    # another run rewrites the bridge just before it is loaded
    def encode_after_an_edit(table: pa.Table):
        (bridge / "README.md").write_text("another bridge\n")
        return stages.encode(table)

    with pytest.raises(
        InputChanged, match=f"bridge model {bridge} changed while its vectors were encoded"
    ):
        initialise(cfg, Stages(encode=encode_after_an_edit, rows=stages.rows))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out" / SUCCESS).exists()
    assert [p.name for p in (tmp_path / "cache").glob("*") if not p.name.startswith(".tmp-")] == []


ENCODE_CACHE_FILLERS = {"encode_judged", "encode_corpus", "encode_queries"}
"""The functions that fill the encode cache shared between jobs (keyed by the inputs'
identities): the jobs call the first, which calls the other two."""
PINNED_JOBS = {"sembridge_ray/recipes/evaluate/run.py", "sembridge_ray/recipes/export/run.py"}
"""The drivers whose swap of the model while it encodes ``tests/ray/test_pinned_inputs.py`` walks
(``ENCODING_JOBS`` there): a new job that fills the cache must join that walk."""


def _calls_of_cache_fillers(root: Path) -> dict[str, list[ast.Call]]:
    found: dict[str, list[ast.Call]] = {}
    for folder in ("sembridge_ray", "jobs", "benchmarks", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    if name in ENCODE_CACHE_FILLERS:
                        found.setdefault(str(path.relative_to(root)), []).append(node)
    return found


def test_every_job_that_fills_the_encode_cache_pins_what_it_read() -> None:
    """The pin is a required argument of the cache-filling encodings (no default to forget), every
    call passes it, and every module that calls them is a job whose swap test runs (issue 42,
    point 1: the export encoded unpinned, and a model swapped meanwhile poisoned the cache)."""
    from sembridge_ray.retrieval import encode

    for name in ENCODE_CACHE_FILLERS:
        parameter = inspect.signature(getattr(encode, name)).parameters["pinned"]
        assert parameter.default is inspect.Parameter.empty, name
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
    calls = _calls_of_cache_fillers(Path(__file__).resolve().parents[2])
    assert set(calls) == {*PINNED_JOBS, "sembridge_ray/retrieval/encode.py"}
    for module, nodes in calls.items():
        for node in nodes:
            assert any(k.arg == "pinned" for k in node.keywords), (module, node.lineno)


class _Keyed(Exception):
    pass


@pytest.mark.parametrize(("spec", "per_split"), [("xquad:en", True), ("sick", False)])
def test_the_export_keys_a_corpus_encoding_as_evaluate_does(
    spec: str, per_split: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XQuAD's splits have corpora of their own: the export keyed every split's corpus alike, so a
    second split was served the first one's documents."""
    from types import SimpleNamespace

    from sembridge_ray.data.retrieval import RetrievalData
    from sembridge_ray.recipes.export import run as driver
    from sembridge_ray.recipes.export.config import ExportConfig
    from sembridge_ray.retrieval import encode
    from sembridge_ray.retrieval.store import fingerprint
    from sembridge_ray.runtime.executor import LocalExecutor

    def keyed(cfg: object, model: str, data: object, key: str, *args: object, **kw: object) -> None:
        raise _Keyed(key)

    monkeypatch.setattr(encode, "encode_corpus", keyed)
    keys = {}
    for split in ("dev", "test"):
        cfg = ExportConfig(
            target="qdrant", model="m", dataset=spec, output=str(tmp_path), split=split
        )
        data = cast("RetrievalData", SimpleNamespace(split=split))
        with pytest.raises(_Keyed) as found:
            driver._encoded(
                cfg, tmp_path, "m", ("m-id", "d-id"), data, [], lambda: None, LocalExecutor()
            )
        keys[split] = str(found.value)
    key = fingerprint("m-id", "d-id")  # the model's and the dataset's identities
    assert keys == (
        {s: fingerprint(key, s) for s in keys} if per_split else dict.fromkeys(keys, key)
    )
