"""The benchmark's bookkeeping (no timing here): rates converted to the paper's lengths, the merged
JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.measured import flops_per_token, measured_record, write_measured
from benchmarks.peers import paper_rates


def test_rates_are_converted_to_the_papers_lengths_in_proportion_to_tokens() -> None:
    lines: list[dict[str, object]] = [
        {
            "comparison": "train_step",
            "case": {"query_length": 64, "doc_length": 128},
            "project": {"examples_per_s": 3.0},
        },
        {"comparison": "encode_documents", "mean_tokens": 12.8, "project": {"texts_per_s": 100.0}},
        {"comparison": "bridge_weights", "bridge_strings_per_s": 900.0},
        {"comparison": "retrieval_encoder_pisa", "note": "skipped"},
    ]
    assert paper_rates(lines) == {
        "train_examples_per_s": pytest.approx(3.0 * 192 / 320),
        "docs_per_s": pytest.approx(100.0 * 12.8 / 256),
        "bridge_strings_per_s": 900.0,
    }


def test_bert_base_costs_about_217_mflops_per_token() -> None:
    assert flops_per_token(12, 768) == pytest.approx(2 * (12 * 12 * 768**2 + 768 * 30_522))
    assert 0.2 < flops_per_token(6, 384) / flops_per_token(12, 768) < 0.22


def test_measured_json_keeps_rates_a_later_run_did_not_measure(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "measured.json"
    write_measured(path, {"source": "a", "device": "cuda", "docs_per_s": 5.0, "gpu_scale": 1.0})
    write_measured(path, measured_record("cuda", "b", {"train_examples_per_s": 7.0}))
    data = json.loads(path.read_text())
    assert (
        data["source"],
        data["docs_per_s"],
        data["train_examples_per_s"],
        data["gpu_scale"],
    ) == ("b", 5.0, 7.0, 1.0)


@pytest.mark.parametrize("skip", [{"project_scan"}, {"pisa_wand"}])
def test_retrieval_refuses_to_skip_the_scan_or_an_unknown_side(skip: set[str]) -> None:
    from benchmarks.retrieval_peers import compare_corpus

    with pytest.raises(ValueError, match=next(iter(skip))):
        compare_corpus("synthetic", 10, 2, skip=frozenset(skip))


def test_pisa_and_seismic_sides_find_the_scans_documents() -> None:
    """The peers as the benchmark drives them, on a small synthetic corpus: Seismic's exact scan
    returns the project's exact answer (the oracle here is the project's scan, itself checked
    against brute force in test_retrieval_index); PISA's top-10 on quantised weights nearly always
    does."""
    pytest.importorskip("pyterrier_pisa")
    pytest.importorskip("seismic")
    from benchmarks.retrieval_peers import compare_corpus

    lines = compare_corpus("synthetic", 3000, 20, repeats=1, skip=frozenset({"seismic_approx"}))
    by_side = {line["peer"]["side"]: line for line in lines if "peer" in line}
    assert set(by_side) == {"seismic_exact", "pisa_maxscore", "pisa_bmw", "pisa_ranked_or"}
    assert by_side["seismic_exact"]["peer"]["recall@10"] >= 0.99
    for side in ("pisa_maxscore", "pisa_bmw", "pisa_ranked_or"):
        assert by_side[side]["peer"]["recall@10"] >= 0.95
    assert all(line["project"]["side"] == "project_scan" for line in by_side.values())


def test_a_cpu_record_scales_the_bridge_to_bge_m3() -> None:
    """BGE-M3 (24 x 1024, no projection) costs about 28x MiniLM-L6's encoder per token; BERT-base's
    MLM about 4.9x MiniLM-L6's MLM: the bridge's CPU rate is scaled by their quotient on top of the
    file's gpu_scale."""
    from benchmarks.measured import BRIDGE_VS_ENCODERS

    minilm, bge = 2 * 6 * 12 * 384**2, 2 * 24 * 12 * 1024**2
    mlm_ratio = (2 * (6 * 12 * 384**2 + 384 * 30_522)) / (2 * (12 * 12 * 768**2 + 768 * 30_522))
    assert pytest.approx((minilm / bge) / mlm_ratio) == BRIDGE_VS_ENCODERS
    cpu = measured_record("cpu", "t", {"bridge_strings_per_s": 100.0, "docs_per_s": 10.0})
    assert (
        cpu["bridge_strings_per_s"] == pytest.approx(100.0 * BRIDGE_VS_ENCODERS)
        and cpu["docs_per_s"] == 10.0
    )
    assert "BGE-M3" in cpu["scaling"]
    gpu = measured_record("cuda", "t", {"bridge_strings_per_s": 100.0})
    assert (gpu["bridge_strings_per_s"], gpu["gpu_scale"]) == (100.0, 1.0)


def test_a_kept_rate_keeps_its_gpu_equivalent_when_the_scale_is_remeasured(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    write_measured(path, {"source": "a", "device": "cpu", "docs_per_s": 5.0, "gpu_scale": 200.0})
    write_measured(
        path, {"source": "b", "device": "cpu", "train_examples_per_s": 2.0, "gpu_scale": 100.0}
    )
    data = json.loads(path.read_text())
    assert data["docs_per_s"] * data["gpu_scale"] == pytest.approx(5.0 * 200.0)
    assert data["train_examples_per_s"] * data["gpu_scale"] == pytest.approx(2.0 * 100.0)
