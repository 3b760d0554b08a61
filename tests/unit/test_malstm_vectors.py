from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese.vectors import assemble_matrix, parse_source, read_word2vec

WORDS = {"man": [1.0, 0.0, 0.0], "guitar": [0.0, 2.0, 0.0], "play": [0.5, 0.5, 0.5]}


@pytest.fixture(params=[True, False], ids=["binary", "text"])
def w2v_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=3)
    kv.add_vectors(list(WORDS), np.array(list(WORDS.values()), dtype=np.float32))
    path = tmp_path / ("vectors.bin" if request.param else "vectors.txt")
    kv.save_word2vec_format(str(path), binary=request.param)
    return path


def test_word2vec_loader_reads_binary_and_text(w2v_file: Path) -> None:
    kind, path = parse_source(f"word2vec:{w2v_file}")
    assert kind == "word2vec" and path == w2v_file
    found = read_word2vec(path, ["man", "Guitar", "zebra"])
    # "Guitar" falls back to "guitar"; "zebra" is out of vocabulary
    assert set(found) == {"man", "Guitar"}
    np.testing.assert_array_equal(found["Guitar"], [0.0, 2.0, 0.0])


def test_missing_or_bad_vectors_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"word2vec vectors file not found: .*nope\.bin"):
        parse_source(f"word2vec:{tmp_path / 'nope.bin'}")
    with pytest.raises(
        InputError, match=r"expected one of minilm, minilm-context, minilm-input or .word2vec:PATH."
    ):
        parse_source("glove")
    bad = tmp_path / "bad.txt"
    bad.write_text("not a header\n")
    with pytest.raises(InputError, match="not a word2vec file"):
        read_word2vec(bad, ["man"])


def test_matrix_has_zero_padding_unit_rows_and_seeded_small_oov_rows() -> None:
    found = {w: np.array(v, dtype=np.float32) for w, v in WORDS.items()}
    words = ["man", "zebra", "guitar"]
    vec = assemble_matrix(words, found, np.random.default_rng(0), oov_std=0.01)
    again = assemble_matrix(words, found, np.random.default_rng(0), oov_std=0.01)
    assert vec.matrix.shape == (4, 3) and not vec.matrix[0].any()
    assert vec.oov.tolist() == [False, False, True, False]
    np.testing.assert_allclose(np.linalg.norm(vec.matrix[[1, 3]], axis=1), 1.0, rtol=1e-6)
    assert 0 < np.abs(vec.matrix[2]).max() < 0.1
    np.testing.assert_array_equal(vec.matrix, again.matrix)
    assert np.isnan(vec.cosine(1, 2)) and vec.cosine(1, 3) == pytest.approx(0.0)
