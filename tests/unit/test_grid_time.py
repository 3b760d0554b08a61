"""``benchmarks/grid_time.py``: a grid's time per stage kind and language, from its timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import grid_time


def test_the_table_sums_the_stages_that_ran_by_kind_and_language(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        ("", "sources/splade-tiny/test", "evaluate", 6.0, False),
        ("", "baselines/bm25/ru/xquad/test", "bm25", 0.5, False),
        ("m__ru__sembridge__a4", "init", "init", 4.0, False),
        ("m__ru__sembridge__a4", "xquad/zero_shot", "evaluate", 2.0, False),
        ("m__ru__sembridge__a4", "xquad/finetune", "finetune", 10.0, False),
        ("m__ru__sembridge__a4", "seed-1/xquad/finetune", "finetune", 12.0, False),
        ("m__ru__sembridge__a4", "seed-1/xquad/finetuned+bm25", "fusion", 1.0, False),
        ("m__zh__random", "init", "init", 99.0, True),  # finished before: not counted
        ("m__zh__random", "init", "init", 3.0, False),
    ]
    (tmp_path / "timings.jsonl").write_text(
        "".join(
            json.dumps({"cell": c, "stage": s, "job": j, "seconds": t, "skipped": k}) + "\n"
            for c, s, j, t, k in lines
        )
    )
    assert grid_time.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "| fine-tune | 22 s (2 × 11.0) | – | – | 0.4 min |" in out
    assert "| init | 4 s (1 × 4.0) | 3 s (1 × 3.0) | – | 0.1 min |" in out
    summary = json.loads(out[-1])
    assert summary["stages"] == 8 and summary["minutes"] == pytest.approx(38.5 / 60, abs=0.05)
    assert grid_time.main([str(tmp_path / "nothing")]) == 2
