"""Caches verify what they serve (:mod:`sembridge_ray.cache`): the bridge vectors, the evaluate
encodings, the MaLSTM word vectors and the fine-tuning stream. A flipped byte or a truncated file is
one warning naming the file, the entry is moved aside and recomputed (identical to the first
computation); a good entry is served without recomputing; two writers of one entry in two processes
publish one entry and both return it."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sembridge_ray import cache
from sembridge_ray.data import pairs as pairs_module
from sembridge_ray.data import stream
from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.embed_init.bridge import BRIDGE_FILE, cached_vectors
from sembridge_ray.retrieval.sources import VECTORS, cache_ready, cached
from sembridge_ray.siamese import vectors as word_vectors
from tests.unit import cache_writers


def flip(path: Path) -> None:
    """Invert 4 bytes in the middle of ``path`` (inside a Parquet data page, an npz member, a JSON
    value)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


DAMAGE = {"flipped": flip, "truncated": truncate}


class counted:
    """``fn``, counting its calls."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)


def one_warning(caplog: pytest.LogCaptureFixture, file: Path) -> str:
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(file) in warnings[0], warnings
    return warnings[0]


def moved_aside(entry: Path) -> list[Path]:
    return sorted(entry.parent.glob(f"{entry.name}{cache.CORRUPT}*"))


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.rglob(f"{cache.TMP_PREFIX}*"))


# ---- the mechanism
# ----------------------------------------------------------------------------------------


def _fetch_bytes(entry: Path, payload: bytes = b"payload") -> tuple[bytes, bool]:
    def build(tmp: Path) -> bytes:
        (tmp / "sub").mkdir(parents=True)
        (tmp / "sub" / "data.bin").write_bytes(payload)
        return payload

    return cache.fetch(entry, lambda found: found.read_bytes("sub/data.bin"), build, "test cache")


@pytest.mark.parametrize(
    "damage",
    [
        "manifest missing",
        "manifest garbled",
        "file missing",
        "file added",
        "file flipped",
    ],
)
def test_a_damaged_entry_is_named_moved_aside_and_rebuilt(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = tmp_path / "entry"
    assert _fetch_bytes(entry) == (b"payload", False)
    manifest, data = entry / cache.MANIFEST, entry / "sub" / "data.bin"
    named = {
        "manifest missing": (manifest, lambda: manifest.unlink()),
        "manifest garbled": (manifest, lambda: manifest.write_text("{not json")),
        "file missing": (data, lambda: data.unlink()),
        "file added": (
            entry / "sub" / "stray.bin",
            lambda: (entry / "sub" / "stray.bin").write_bytes(b"x"),
        ),
        "file flipped": (data, lambda: flip(data)),
    }
    file, act = named[damage]
    act()
    with caplog.at_level(logging.INFO):
        assert _fetch_bytes(entry) == (b"payload", False)
    one_warning(caplog, file)
    assert len(moved_aside(entry)) == 1 and _fetch_bytes(entry) == (b"payload", True)
    assert not leftovers(tmp_path)


def test_a_failed_build_leaves_neither_entry_nor_temporary(tmp_path: Path) -> None:
    def build(tmp: Path) -> bytes:
        tmp.mkdir(parents=True)
        (tmp / "half").write_bytes(b"half")
        raise RuntimeError("encoder died")

    with pytest.raises(RuntimeError, match="encoder died"):
        cache.fetch(tmp_path / "entry", lambda found: b"", build, "test cache")
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_left_by_a_dead_writer_is_removed_a_live_ones_is_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = socket.gethostname()
    gone = tmp_path / f"{cache.TMP_PREFIX}entry@{host}-{int(dead.stdout)}-abcd"
    live = tmp_path / f"{cache.TMP_PREFIX}entry@{host}-{os.getpid()}-abcd"
    # pid gone, but written just now
    recent = tmp_path / f"{cache.TMP_PREFIX}entry@{host}-{int(dead.stdout)}-ef01"
    for directory in (gone, live, recent):
        (directory / "vectors").mkdir(parents=True)
        (directory / "vectors" / "part.parquet").write_bytes(b"x")
    old = time.time() - 2 * cache.QUIET_S
    for path in (gone, live, gone / "vectors", live / "vectors", gone / "vectors" / "part.parquet"):
        os.utime(path, (old, old))
    os.utime(live / "vectors" / "part.parquet", (old, old))
    _fetch_bytes(tmp_path / "entry")
    assert not gone.exists() and live.exists() and recent.exists()


def test_two_writers_in_two_processes_publish_one_entry(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    results = _race(cache_writers.bytes_writer, str(entry))
    (first, first_hit), (second, second_hit) = results
    # both built; the loser serves the winner's
    assert first == second and not first_hit and not second_hit
    assert first in (b"written by 0", b"written by 1")
    assert cache.load(entry, lambda found: found.read_bytes("data.bin"), "test cache") == first
    assert not leftovers(tmp_path) and not moved_aside(entry)


def _race(target: Callable[..., None], where: str) -> list[tuple[Any, Any]]:
    """Run ``target(where, index, barrier, results)`` in two spawned processes at once; their
    results by index."""
    # not fork: the parent holds torch's and Arrow's threads
    mp = multiprocessing.get_context("spawn")
    barrier, results = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=target, args=(where, i, barrier, results)) for i in range(2)]
    for proc in procs:
        proc.start()
    got = {}
    for _ in procs:
        index, value, hit = results.get(timeout=3 * cache_writers.BARRIER_S)
        got[index] = (value, hit)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return [got[0], got[1]]


# ---- bridge vectors (init)
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_bridge_cache_damage_is_detected_and_recomputed(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strings, encode = cache_writers.strings(), counted(cache_writers.vectors)
    expected = cache_writers.vectors(strings)
    np.testing.assert_array_equal(cached_vectors(tmp_path, "key", strings, encode), expected)
    np.testing.assert_array_equal(cached_vectors(tmp_path, "key", strings, encode), expected)
    assert encode.calls == 1  # the second call was served by the cache
    file = tmp_path / "key" / BRIDGE_FILE
    DAMAGE[damage](file)
    damaged = file.read_bytes()
    with caplog.at_level(logging.WARNING):
        again = cached_vectors(tmp_path, "key", strings, encode)
    one_warning(caplog, file)
    np.testing.assert_array_equal(again, expected)
    assert encode.calls == 2
    (aside,) = moved_aside(tmp_path / "key")
    # kept for a person to look at, never served
    assert (aside / BRIDGE_FILE).read_bytes() == damaged
    np.testing.assert_array_equal(cached_vectors(tmp_path, "key", strings, encode), expected)
    assert encode.calls == 2


def test_bridge_cache_holding_another_vocabulary_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strings, encode = cache_writers.strings(), counted(cache_writers.vectors)
    cached_vectors(tmp_path, "key", strings, encode)
    other = pa.table({"id": pa.array([0, 1], pa.int32()), "text": ["[PAD]", "dog"]})
    with caplog.at_level(logging.WARNING):
        got = cached_vectors(tmp_path, "key", other, encode)
    one_warning(caplog, tmp_path / "key" / BRIDGE_FILE)
    np.testing.assert_array_equal(got, cache_writers.vectors(other))


@pytest.mark.slow
def test_two_inits_encoding_one_bridge_at_once_share_one_entry(tmp_path: Path) -> None:
    (first, _), (second, _) = _race(cache_writers.bridge_writer, str(tmp_path))
    np.testing.assert_array_equal(first, second)
    strings = cache_writers.strings()
    assert any(np.array_equal(first, cache_writers.vectors(strings, offset=i)) for i in (0, 1))
    never = counted(np.zeros)
    np.testing.assert_array_equal(cached_vectors(tmp_path, "bridge-key", strings, never), first)
    assert never.calls == 0
    assert not leftovers(tmp_path) and not moved_aside(tmp_path / "bridge-key")


# ---- encodings (evaluate)
# ---------------------------------------------------------------------------------


def _encodings(tmp: Path) -> dict[str, Any]:
    (tmp / VECTORS).mkdir()
    for part in range(2):
        table = pa.table(
            {"id": [f"d{part}{i}" for i in range(3)], "weight": [float(part + i) for i in range(3)]}
        )
        pq.write_table(table, tmp / VECTORS / f"part-{part:06d}.parquet")
    return {"rows": 6}


def _read_encodings(directory: Path) -> list[dict[str, list[Any]]]:
    return [pq.read_table(f).to_pydict() for f in sorted(directory.glob("*.parquet"))]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_encode_cache_damage_is_detected_and_recomputed(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry, build = tmp_path / "cache" / "docs-abc", counted(_encodings)
    reference = tmp_path / "reference"
    reference.mkdir()
    _encodings(reference)
    expected = _read_encodings(reference / VECTORS)
    directory, hit = cached(entry, build)
    assert (directory, hit) == (entry / VECTORS, False) and _read_encodings(directory) == expected
    assert (
        cached(entry, build) == (entry / VECTORS, True) and build.calls == 1 and cache_ready(entry)
    )
    file = entry / VECTORS / "part-000001.parquet"
    DAMAGE[damage](file)
    with caplog.at_level(logging.WARNING):
        assert not cache_ready(entry)
    one_warning(caplog, file)
    assert cached(entry, build) == (entry / VECTORS, False) and build.calls == 2
    assert _read_encodings(directory) == expected and len(moved_aside(entry)) == 1
    assert json.loads((entry / "info.json").read_text()) == {"rows": 6}


def test_an_encode_cache_entry_of_the_old_layout_is_rebuilt_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry, build = tmp_path / "docs-abc", counted(_encodings)
    entry.mkdir()
    _encodings(entry)
    old = {
        "files": {},
        "exclude": [VECTORS],
        "sizes": {"vectors/part-000000.parquet": 1},
        "rows": 6,
    }  # no digests
    (entry / "_SUCCESS").write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING):
        assert cached(entry, build) == (entry / VECTORS, False)
    one_warning(caplog, entry / cache.MANIFEST)
    assert cached(entry, build) == (entry / VECTORS, True) and build.calls == 1


@pytest.mark.slow
def test_two_evaluations_encoding_one_corpus_at_once_share_one_entry(tmp_path: Path) -> None:
    entry = tmp_path / "cache" / "docs-abc"
    (first, first_hit), (second, second_hit) = _race(cache_writers.encode_cache_writer, str(entry))
    assert first == second and first["value"][0] in (0.0, 1.0) and not first_hit and not second_hit
    assert cache_ready(entry) and not leftovers(tmp_path) and not moved_aside(entry)


# ---- word vectors (MaLSTM)
# --------------------------------------------------------------------------------


class FakeTokenizer:
    unk_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [0] if text == "qqq" else [len(text)]}


class FakeMiniLM:
    """Stands in for SentenceTransformer: deterministic vectors of the words' lengths, and a count
    of encodes."""

    encoded: ClassVar[list[str]] = []

    def __init__(self, path: str, device: str = "cpu") -> None:
        self.tokenizer = FakeTokenizer()

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        FakeMiniLM.encoded += texts
        return np.array([[len(t), 1.0, -len(t)] for t in texts], np.float32)


@pytest.fixture
def fake_minilm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    model = tmp_path / "minilm"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(word_vectors, "minilm_dir", lambda: model)
    # the module itself, not its attribute: importing sentence-transformers takes seconds
    monkeypatch.setitem(
        sys.modules, "sentence_transformers", SimpleNamespace(SentenceTransformer=FakeMiniLM)
    )
    FakeMiniLM.encoded = []
    return tmp_path / "word-vectors"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_word_vector_cache_damage_is_detected_and_recomputed(
    damage: str, fake_minilm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    words = ["cat", "zebra", "qqq"]
    first = word_vectors.encode_minilm(words, fake_minilm)
    assert sorted(first) == ["cat", "zebra"] and FakeMiniLM.encoded == words  # qqq is all [UNK]
    np.testing.assert_array_equal(first["zebra"], [5.0, 1.0, -5.0])
    served = word_vectors.encode_minilm(words, fake_minilm)
    assert FakeMiniLM.encoded == words and {w: v.tolist() for w, v in served.items()} == {
        w: v.tolist() for w, v in first.items()
    }
    (part,) = cache.entries(next(fake_minilm.iterdir()), "part-")
    DAMAGE[damage](part / "words.npz")
    with caplog.at_level(logging.WARNING):
        again = word_vectors.encode_minilm(words, fake_minilm)
    one_warning(caplog, part / "words.npz")
    assert FakeMiniLM.encoded == words + words and len(moved_aside(part)) == 1
    assert {w: v.tolist() for w, v in again.items()} == {w: v.tolist() for w, v in first.items()}


def test_word_vector_parts_add_up_and_merge_when_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(word_vectors, "_MAX_PARTS", 3)
    path = tmp_path / "context-x"
    expected: dict[str, list[float] | None] = {}
    for i in range(5):
        word_vectors._write_cache(path, {f"w{i}": np.full(2, i, np.float32), f"oov{i}": None})
        expected |= {f"w{i}": [float(i)] * 2, f"oov{i}": None}
        got = word_vectors._read_cache(path)
        assert {w: None if v is None else v.tolist() for w, v in got.items()} == expected
    assert len(cache.entries(path, "part-")) <= 3 and not leftovers(tmp_path)


@pytest.mark.slow
def test_two_runs_adding_words_at_once_lose_none(tmp_path: Path) -> None:
    path = tmp_path / "minilm-x"
    word_vectors._write_cache(path, {"shared": np.zeros(4, np.float32)})
    (before0, _), (before1, _) = _race(cache_writers.word_vector_writer, str(path))
    assert before0 == before1 == ["shared"]  # both read before either wrote
    got = word_vectors._read_cache(path)
    word1 = got["word1"]
    assert (
        sorted(got) == ["shared", "word0", "word1"]
        and word1 is not None
        and word1.tolist() == [1.0] * 4
    )
    assert not leftovers(tmp_path)


# ---- training stream (finetune)
# ---------------------------------------------------------------------------


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.parquet"
    pq.write_table(
        pa.table({QUERY: [f"q{i}" for i in range(10)], POSITIVE: [f"d{i}" for i in range(10)]}),
        path,
    )
    return path


def _request(pairs: Path, **changes: Any) -> stream.StreamInfo:
    settings: dict[str, Any] = {
        "split": "train",
        "hard_negatives": 0,
        "batch_size": 4,
        "epochs": 2,
        "max_steps": 3,
        "seed": 7,
    }
    return stream.StreamInfo(spec=str(pairs), **(settings | changes))


@pytest.mark.parametrize("file", [stream.STREAM_FILE, stream.STREAM_INFO])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_training_stream_damage_is_detected_and_rebuilt(
    file: str,
    damage: str,
    pairs_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pairs = counted(pairs_module.training_pairs)
    monkeypatch.setattr(stream, "training_pairs", pairs)
    expected = stream.training_stream(pq.read_table(pairs_file), batch_size=4, steps=3, seed=7)
    path, info = stream.materialise_stream(_request(pairs_file), tmp_path / "data")
    assert pq.read_table(path).equals(expected) and info.total_steps == 3
    assert (
        stream.materialise_stream(_request(pairs_file), tmp_path / "data") == (path, info)
        and pairs.calls == 1
    )
    DAMAGE[damage](path.parent / file)
    with caplog.at_level(logging.WARNING):
        again = stream.materialise_stream(_request(pairs_file), tmp_path / "data")
    one_warning(caplog, path.parent / file)
    assert again == (path, info) and pq.read_table(path).equals(expected) and pairs.calls == 2
    assert len(moved_aside(path.parent)) == 1


def test_a_stream_made_for_other_settings_is_not_reused(pairs_file: Path, tmp_path: Path) -> None:
    stream.materialise_stream(_request(pairs_file), tmp_path / "data")
    path, info = stream.materialise_stream(_request(pairs_file, seed=8), tmp_path / "data")
    assert info.seed == 8 and pq.read_table(path).equals(
        stream.training_stream(pq.read_table(pairs_file), batch_size=4, steps=3, seed=8)
    )
