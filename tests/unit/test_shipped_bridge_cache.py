"""The bridge vectors the assets ship (``assets/sembridge_ray_assets/bridge_cache``, built by
``scripts/bridge_cache.py``) are used only when they verify: every file against its sha256, the
strings against the vocabulary's, and a sample of the vectors against the bridge model encoding them
again. A refused entry costs one warning and an encoding, and is left as it is (it belongs to the
package, not to the cache)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sembridge_ray import bundled, cache
from sembridge_ray.embed_init import bridge
from sembridge_ray.embed_init.bridge import BRIDGE_FILE, VECTOR, cached_vectors, shipped_vectors
from sembridge_ray.embed_init.pipeline import bridge_side, in_process_stages
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.resources import bridge_cache_dir
from sembridge_ray.sparse.model import load_tokenizer
from tests.unit import cache_writers
from tests.unit.test_caches import counted, flip

KEY = "bridgefp-vocabfp"


def strings(n: int = 40) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int32()), "text": [f"piece{i}" for i in range(n)]})


def ship(root: Path, table: pa.Table, vecs: np.ndarray, key: str = KEY) -> Path:
    """A shipped entry as ``scripts/bridge_cache.py`` writes it: parts ``vectors-<n>.parquet`` (here
    of 15 rows)."""

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        full = table.append_column(VECTOR, pa.array(list(vecs), pa.list_(pa.float32())))
        for n, start in enumerate(range(0, full.num_rows, 15)):
            pq.write_table(
                full.slice(start, 15),
                tmp / f"vectors-{n:03d}.parquet",
                compression="zstd",
                use_byte_stream_split=[f"{VECTOR}.list.element"],
            )

    cache.publish(root / key, build, lambda found: None, "test")
    return root / key


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "package"
    monkeypatch.setattr(bridge, "bridge_cache_dir", lambda: root)
    return ship(root, strings(), cache_writers.vectors(strings()))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_verified_entry_is_used_after_a_spot_check_and_then_cached(
    shipped: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table, seen = strings(), list[int]()

    def encode(rows: pa.Table) -> np.ndarray:
        seen.append(rows.num_rows)
        return cache_writers.vectors(rows)

    with caplog.at_level(logging.INFO):
        got = cached_vectors(tmp_path / "user", KEY, table, encode)
    np.testing.assert_array_equal(got, cache_writers.vectors(table))
    assert seen == [bridge.SPOT_CHECK]  # the sample, never the whole vocabulary
    assert not warnings(caplog) and any("verified" in r.getMessage() for r in caplog.records)
    # published in the user's cache: served from there next
    assert (tmp_path / "user" / KEY / BRIDGE_FILE).is_file()
    np.testing.assert_array_equal(cached_vectors(tmp_path / "user", KEY, table, encode), got)
    assert seen == [bridge.SPOT_CHECK]


def test_a_tampered_entry_is_refused_left_in_place_and_recomputed(
    shipped: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    part = shipped / "vectors-001.parquet"
    flip(part)
    tampered = part.read_bytes()
    table, encode = strings(), counted(cache_writers.vectors)
    with caplog.at_level(logging.WARNING):
        got = cached_vectors(tmp_path / "user", KEY, table, encode)
    (line,) = warnings(caplog)
    assert str(part) in line and "sha256" in line and "not used" in line
    np.testing.assert_array_equal(got, cache_writers.vectors(table))
    assert encode.calls == 1  # the whole vocabulary, encoded
    assert part.read_bytes() == tampered and not list(shipped.parent.glob(f"*{cache.CORRUPT}*"))


def test_an_entry_of_other_vectors_fails_the_spot_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Digests that verify do not make the vectors the bridge's: vectors of another model or
    precision (here off by 1e-3, bf16's order of error) are refused on the sample encoded again."""
    table = strings()
    entry = ship(tmp_path / "package", table, cache_writers.vectors(table) + np.float32(1e-3))
    with caplog.at_level(logging.WARNING):
        got = shipped_vectors(KEY, table, cache_writers.vectors, root=tmp_path / "package")
    assert got is None
    (line,) = warnings(caplog)
    assert str(entry) in line and "differ" in line
    # another machine's fp32
    near = ship(tmp_path / "near", table, cache_writers.vectors(table) + np.float32(1e-6))
    assert (
        near.is_dir()
        and shipped_vectors(KEY, table, cache_writers.vectors, root=tmp_path / "near") is not None
    )


def test_an_entry_of_other_strings_is_refused(
    shipped: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = strings().set_column(1, "text", pa.array([f"other{i}" for i in range(40)]))
    encode = counted(cache_writers.vectors)
    with caplog.at_level(logging.WARNING):
        assert shipped_vectors(KEY, other, encode) is None
    (line,) = warnings(caplog)
    assert "other strings" in line and encode.calls == 0
    # none shipped: silent
    assert shipped_vectors("another-key", strings(), encode) is None and encode.calls == 0
    assert len(warnings(caplog)) == 1


@pytest.mark.slow
def test_the_package_ships_the_bundled_vocabularies_vectors(tmp_path: Path) -> None:
    """The shipped entries are found under the keys the init job computes for the bundled MiniLM
    bridge and the quick start's vocabularies, verify, and pass the spot check against the real
    bridge (``scripts/bridge_cache.py`` rebuilds them when a fingerprint changes)."""
    cfg = InitConfig(method="sembridge", bridge_model="minilm", precision="fp32")
    model = bundled.resolve("minilm")
    bundled.build_sick_bpe(tmp_path / "target")
    toks = {"source": load_tokenizer(model), "target": load_tokenizer(str(tmp_path / "target"))}
    side = bridge_side(
        cfg.method,
        cfg.rule,
        cfg.precision,
        model,
        toks,
        {name: len(tok) for name, tok in toks.items()},
    )
    assert sorted(p.name for p in cache.entries(Path(str(bridge_cache_dir())))) == sorted(
        side.keys.values()
    )
    encode = in_process_stages(model, cfg.bridge_batch_size, "fp32", False).encode
    for name in ("source", "target"):
        vecs = shipped_vectors(side.keys[name], side.strings[name], encode)
        assert vecs is not None and vecs.shape == (len(toks[name]), 384)


def test_the_build_script_runs_both_modes_on_a_tiny_bridge(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``scripts/bridge_cache.py`` (what set-up runs) on the tests' tiny bridge: the shipped entries
    it writes verify and hold the vectors the init job would encode; ``--xling``'s vectors land in
    the init job's cache under the key the init looks up. A refactor that breaks it fails here, not
    in a user's first set-up."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "bridge_cache.py"))
    with pytest.raises(SystemExit) as done:
        script["main"](["--help"])
    assert done.value.code == 0 and "--xling" in capsys.readouterr().out
    bridge_dir = str(fixtures_root / "bridge")
    out, cache_dir = tmp_path / "package", tmp_path / "cache"
    script["shipped"](cache_dir, out, bridge_model=bridge_dir)
    entries = cache.entries(out)
    assert len(entries) == 2 and all(sorted(e.glob("vectors-*.parquet")) for e in entries)
    tok = load_tokenizer(str(fixtures_root / "tok-wordpiece"))
    script["xling"](
        cache_dir, names=(str(fixtures_root / "tok-wordpiece"),), bridge_model=bridge_dir
    )
    cfg = InitConfig(method="sembridge", bridge_model=bridge_dir, precision="fp32")
    side = bridge_side("sembridge", cfg.weighting, "fp32", bridge_dir, {"t": tok}, {"t": len(tok)})
    stages = in_process_stages(bridge_dir, cfg.bridge_batch_size, "fp32", False)
    expected = stages.encode(side.strings["t"])
    never = counted(np.zeros)  # a hit: nothing is encoded again
    found = cached_vectors(cache_dir, side.keys["t"], side.strings["t"], never)
    np.testing.assert_array_equal(found, expected)
    assert never.calls == 0
