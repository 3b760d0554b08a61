"""Text inputs that cannot be read: a byte that is not UTF-8, damaged or truncated gzip data, an
invalid YAML preset. Each is one :class:`InputError` naming the file and the line (and column where
there is one), never a traceback."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sembridge_ray.cli import run, run_job
from sembridge_ray.data.pairs import read_pairs, training_pairs
from sembridge_ray.data.retrieval import (
    jsonl_batches,
    load_beir,
    read_jsonl_queries,
    read_qrels,
    read_tsv_topics,
)
from sembridge_ray.data.sick import read_sick
from sembridge_ray.data.sts import read_sts, read_sts_sentences
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.text import text_lines
from tests.conftest import error_lines

SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"


def _doc(i: int) -> bytes:
    return (
        json.dumps({"_id": f"d{i}", "title": "", "text": f"document number {i} " * 4}).encode()
        + b"\n"
    )


def _with_bad_byte(lines: list[bytes], at: int, column: int) -> bytes:
    """The lines joined, with 0xE9 (Latin-1 é, not UTF-8 on its own) at ``column`` (from 1) of line
    ``at``."""
    line = lines[at - 1]
    lines[at - 1] = line[: column - 1] + b"\xe9" + line[column - 1 :]
    return b"".join(lines)


def test_a_bad_byte_deep_in_a_corpus_names_its_line_and_column(tmp_path: Path) -> None:
    """Line 501 of ~60 KB: far past the first 8 KiB a text-mode file decodes ahead."""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(_with_bad_byte([_doc(i) for i in range(600)], at=501, column=32))
    with pytest.raises(
        InputError, match=rf"^{path}:501: not UTF-8 text \(byte 0xe9 at column 32\)$"
    ):
        list(jsonl_batches([path], "_id", 100))


def test_the_column_counts_characters_not_bytes(tmp_path: Path) -> None:
    path = tmp_path / "topics.tsv"
    # line 2: "м" (2 bytes), then 0xff
    path.write_bytes("q1\tмир\n".encode() + b"q2\t\xd0\xbc\xff\n")
    with pytest.raises(InputError, match=rf"^{path}:2: not UTF-8 text \(byte 0xff at column 5\)$"):
        read_tsv_topics(path)


READERS: dict[str, tuple[str, Callable[[Path], Any], bytes]] = {
    "queries": ("queries.jsonl", read_jsonl_queries, b'{"_id": "q1", "text": "caf\xe9"}\n'),
    "topics": ("topics.tsv", read_tsv_topics, b"q1\tcaf\xe9\n"),
    "qrels": ("qrels.tsv", read_qrels, b"q\xe9 Q0 d1 1\n"),
    "sick": ("SICK_train.txt", read_sick, b"1\tcaf\xe9\tb\t4.5\tNEUTRAL\n"),
    "sts": ("sts.tsv", read_sts, b"4.0\tcaf\xe9\tb\n"),
    "sts sentences": ("sts.tsv", read_sts_sentences, b"4.0\tcaf\xe9\tb\n"),
}


@pytest.mark.parametrize("kind", READERS)
def test_every_text_reader_names_the_file_and_line_of_a_bad_byte(tmp_path: Path, kind: str) -> None:
    name, reader, bad = READERS[kind]
    first = {"sick": SICK_HEADER.encode(), "qrels": b"q0 Q0 d0 1\n"}.get(kind, b"\n")
    path = tmp_path / name
    path.write_bytes(first + bad)
    with pytest.raises(
        InputError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9 at column \d+\)$"
    ):
        reader(path)


def test_gzip_corpora_read_as_plain_ones_and_damage_is_named(tmp_path: Path) -> None:
    lines = [_doc(i) for i in range(600)]
    plain, packed = tmp_path / "docs.jsonl", tmp_path / "docs.jsonl.gz"
    plain.write_bytes(b"".join(lines))
    packed.write_bytes(gzip.compress(b"".join(lines)))
    assert list(text_lines(packed)) == list(text_lines(plain))
    assert [t.to_pydict() for t in jsonl_batches([packed], "_id", 250)] == [
        t.to_pydict() for t in jsonl_batches([plain], "_id", 250)
    ]

    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    with pytest.raises(
        InputError, match=rf"^{truncated}: damaged gzip data after line \d+ \(Compressed file ended"
    ):
        list(jsonl_batches([truncated], "_id", 500))
    crc = bytearray(packed.read_bytes())
    crc[-6] ^= 0xFF  # the CRC32 in the trailer
    (tmp_path / "crc.jsonl.gz").write_bytes(bytes(crc))
    with pytest.raises(
        InputError, match=r"crc.jsonl.gz: damaged gzip data after line 600 \(CRC check failed"
    ):
        list(jsonl_batches([tmp_path / "crc.jsonl.gz"], "_id", 500))
    (tmp_path / "not.jsonl.gz").write_bytes(plain.read_bytes())
    with pytest.raises(
        InputError, match=r"not.jsonl.gz: damaged gzip data at its start \(Not a gzipped file"
    ):
        list(jsonl_batches([tmp_path / "not.jsonl.gz"], "_id", 500))


def test_crlf_lines_read_as_lf_lines(tmp_path: Path) -> None:
    (tmp_path / "crlf.tsv").write_bytes(b"q1\tone\r\nq2\ttwo\r\n")
    assert read_tsv_topics(tmp_path / "crlf.tsv") == {"q1": "one", "q2": "two"}
    assert list(text_lines(tmp_path / "crlf.tsv")) == [(1, "q1\tone\n"), (2, "q2\ttwo\n")]


def test_a_training_set_with_a_bad_byte_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Fine-tuning reads a BEIR directory through the same readers: the error reaches the CLI as one
    line."""
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_bytes(_doc(0) + b'{"_id": "d1", "text": "caf\xe9"}\n')
    (root / "queries.jsonl").write_text('{"_id": "q0", "text": "document"}\n')
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    assert load_beir(root, "train").queries == {"q0": "document"}  # the corpus is streamed later

    def body() -> int:
        training_pairs(str(root), "train")
        return 0

    assert run_job(body) == 2
    assert error_lines(capsys) == [
        f"error: {root}/corpus.jsonl:2: not UTF-8 text (byte 0xe9 at column 27)"
    ]


def test_a_pairs_parquet_with_bytes_that_are_not_text_is_refused(tmp_path: Path) -> None:
    raw = pa.array([b"ok", b"caf\xe9"], pa.binary())
    pq.write_table(
        pa.table({"query": raw.view(pa.string()), "positive": ["a", "b"]}), tmp_path / "bad.parquet"
    )
    with pytest.raises(
        InputError, match=r"bad.parquet: column 'query' is not valid UTF-8 text .*index 1"
    ):
        read_pairs(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"query": ["q", "r"], "positive": raw}), tmp_path / "binary.parquet")
    with pytest.raises(
        InputError, match=r"binary.parquet: column 'positive' holds binary, not text"
    ):
        read_pairs(tmp_path / "binary.parquet")


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("steps: 5\nname: [unclosed\nfoo: bar\n", ":3:4", "expected ',' or ']', but got ':'"),
        ("steps: 5\n\tname: x\n", ":2:1", "found character '\\t' that cannot start any token"),
        ('name: "a\x00"\n', ":1:9", "unacceptable character #x0000"),
        ("steps: 5\nname: b: c\n", ":2:8", "mapping values are not allowed here"),
    ],
)
def test_an_invalid_yaml_preset_is_one_line_with_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, problem: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert run("evaluate", ["--preset", str(path)]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: config preset {path}{where}: not valid YAML: {problem}"), line


def test_a_preset_that_is_not_utf8_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("steps: 5\nname: café\n".encode("latin-1"))
    assert run("evaluate", ["--preset", str(path)]) == 2
    assert error_lines(capsys) == [
        f"error: config preset {path}:2: not UTF-8 text (byte 0xe9 at column 10)"
    ]
