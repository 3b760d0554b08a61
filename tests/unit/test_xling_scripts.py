"""``scripts/xling_recipe.py`` and ``scripts/xling_diagnose.py`` (docs/xling.md names both) on the
tests' tiny models and an XQuAD-format file of 30 articles: their arguments, a real run each, and
figures that agree with what they read."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.reproduce.cells import cell_paths, expand

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
WORDS = ["cat", "dog", "river", "house", "tree", "road", "bird", "ship", "lamp", "book"]


def xquad(root: Path, lang: str = "xx", articles: int = 30) -> Path:
    """An XQuAD-format file: per article one paragraph of two sentences and one question on the
    first."""
    data: list[dict[str, object]] = []
    for n in range(articles):
        a, b = WORDS[n % len(WORDS)], WORDS[(n * 3 + 1) % len(WORDS)]
        context = f"The {a} number {n} sat by the water. A {b} walked along the old road."
        answer = {"text": "by the water", "answer_start": context.index("by the water")}
        qa = {"id": f"q{n}", "question": f"Where did the {a} number {n} sit?", "answers": [answer]}
        data.append({"title": f"t{n}", "paragraphs": [{"context": context, "qas": [qa]}]})
    root.mkdir(parents=True, exist_ok=True)
    (root / f"xquad.{lang}.json").write_text(json.dumps({"data": data}), encoding="utf-8")
    return root


def test_the_recipe_and_the_diagnosis_run_on_tiny_inputs(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = runpy.run_path(str(SCRIPTS / "xling_recipe.py"))
    diagnosis = runpy.run_path(str(SCRIPTS / "xling_diagnose.py"))
    for script in (recipe, diagnosis):
        with pytest.raises(SystemExit) as done:
            script["main"](["--help"])
        assert done.value.code == 0
    capsys.readouterr()
    source = str(fixtures_root / "bert-mlm")
    shared = [
        "--languages",
        "xx",
        "--source",
        source,
        "--bridge",
        str(fixtures_root / "bridge"),
        "--tokenizers",
        f"xx={fixtures_root / 'tok-wordpiece'}",
        "--xquad-dir",
        str(xquad(tmp_path / "xquad")),
    ]
    out = tmp_path / "recipe"
    variants = [
        "--variant",
        "random:method=random",
        "--variant",
        "x:norm_scale=1.5,confidence_gate=0.5",
    ]
    assert recipe["main"](["--out", str(out), "--seeds", "2", *shared, *variants]) == 0
    printed = capsys.readouterr().out
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert [(r["variant"], r["seeds"]) for r in lines] == [
        ("sembridge", 1),
        ("random", 2),
        ("x", 2),
    ]
    found = json.loads((out / "recipe.json").read_text())
    queries = len(found["xx"]["sembridge"]["scores"][0])  # the dev articles' questions
    assert queries > 0 and len(found["xx"]["x"]["scores"]) == 2
    assert len(found["xx"]["x"]["scores"][0]) == queries
    assert "| x | " in printed and "| sembridge | " in printed
    # the diagnosis reads a grid's seed-0 inits: lay the recipe's out as the grid does
    grid = tmp_path / "grid"
    for cell in expand((source,), ("xx",), ("sembridge", "random"), ("4",)):
        shutil.copytree(out / "xx" / cell.method / "s0", cell_paths(grid, cell).init)
    report = tmp_path / "diagnosis.json"
    args = ["--grid", str(grid), "--sample", "50", "--json", str(report), *shared]
    assert diagnosis["main"](args) == 0
    (figures,) = json.loads(report.read_text())
    assert figures["language"] == "xx" and figures["tokens"]["bridge"] > 0
    assert 0 <= figures["self_activation"]["random"]["share"] <= 1
    means = figures["dev_ndcg@10"]
    assert means["sembridge"] == pytest.approx(sum(found["xx"]["sembridge"]["scores"][0]) / queries)
    assert sum(q["queries"] for q in figures["gain_by_csls_quartile"]) <= queries


def test_unreachable_pieces_are_cjk_continuations_only_where_cjk_is_split(tmp_path: Path) -> None:
    """A WordPiece tokenizer that cuts CJK characters apart can never produce ``##`` + one CJK
    character; one that keeps them together can, and then nothing is called unreachable."""
    from transformers import BertTokenizer

    diagnosis = runpy.run_path(str(SCRIPTS / "xling_diagnose.py"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "中", "文", "##中", "##文", "##ab", "a"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ids = np.arange(len(vocab))
    for split, expected in ((True, [7, 8]), (False, [])):
        tok = BertTokenizer(str(tmp_path / "vocab.txt"), tokenize_chinese_chars=split)
        # the oracle: does the tokenizer ever emit the piece for any two-character CJK text?
        emitted = {p for a in "中文" for b in "中文" for p in tok.tokenize(a + b)}
        assert [vocab[i] for i in expected] == [p for p in ("##中", "##文") if p not in emitted]
        assert diagnosis["unreachable_pieces"](tok, ids).tolist() == expected
