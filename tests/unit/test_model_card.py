"""The model card the init and fine-tuning jobs write: it names the method, α, bridge and target
tokenizer, and sentence-transformers loads the model with it and keeps it (so a push carries it);
pushing offline is one line.

A quick-like model (the tiny fixtures as inputs, the demo's own SICK assets as training and
evaluation data, evaluations and exports as finished outputs of their own, the way those jobs leave
them) is published with a card whose metadata the hub's own parser reads: the licence of the SICK
training pairs (CC BY-NC-SA 3.0, as SICK's bundled readme states it), nDCG@10 zero-shot and
fine-tuned in the ``model-index``, and no absolute path of this machine. Publishing writes nothing
into the model's finished output but its push record."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import EvalResult, ModelCardData, model_index_to_eval_results

from sembridge_ray.cli import run_job
from sembridge_ray.embed_init.config import WeightingConfig
from sembridge_ray.export.report import ExportReport
from sembridge_ray.model_card import CARD, render, write_card
from sembridge_ray.provenance import (
    PROVENANCE,
    UNKNOWN,
    InputLicence,
    combined_licence,
    hub_licence,
    input_licences,
    read_provenance,
)
from sembridge_ray.publish import PUSHED, SCORED, evaluation, publish, scores_of
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.finetune.final_model import card_provenance
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce.config import DemoSettings
from sembridge_ray.resources import asset, sick_dir
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import RunIdentity, path_identity
from sembridge_ray.runtime.manifest import (
    IDENTITY,
    is_complete,
    output_fingerprint,
    read_manifest,
    write_success,
)

# An absolute path of a POSIX machine as it would appear in text (not a URL's path: no scheme or
# host before it).
ABSOLUTE = re.compile(
    r"(?<![\w:/.\-])/(?:home|tmp|root|work|Users|var|private|mnt|opt|srv|data|scratch)/"
)


@pytest.fixture(scope="module")
def model_dir(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("card") / "init"
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-bytebpe"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(out),
        weighting=WeightingConfig(alpha=3.0),
        language="ko",
        cache_dir=str(out.parent / "cache"),
        samples=2,
    )
    return Path(initialise(cfg).model)


def test_the_card_names_the_method_alpha_bridge_and_target(model_dir: Path) -> None:
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    assert "| method | sembridge, α = 3 |" in card and "language:\n- ko" in card
    assert "| bridge model | bridge |" in card and "| target tokenizer | tok-bytebpe |" in card
    prov = read_provenance(model_dir)["init"]
    assert sum(prov["kinds"].values()) == prov["vocab_size"] > 0
    assert f"{sum(prov['support_histogram'].values())} tokens)" in card
    assert "## Licences of the inputs" in card


def test_sparse_encoder_loads_the_model_and_keeps_the_card(model_dir: Path) -> None:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(model_dir), device="cpu")
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    assert model._model_card_text == card
    vocab = len(model.tokenizer)
    assert model.encode_query(["a man plays a guitar"], convert_to_tensor=True).shape[-1] == vocab
    assert f"Output Dimensionality:** {vocab} dimensions" in card


def test_a_fine_tuned_card_extends_the_initialisation() -> None:
    prov = {  # as sembridge.json held it before licences were recorded: they are looked up by name
        "init": {"source_model": "naver/splade-v3", "method": "focus", "language": "ar"},
        "finetune": {"train": "miracl:ar", "steps": 120, "batch_size": 64, "lr": 2e-5},
    }
    card = render(prov)
    assert "base_model: naver/splade-v3" in card and "for Arabic: naver/splade-v3" in card
    # splade-v3's licence
    assert "| training data | miracl:ar |" in card and "CC BY-NC-SA 4.0" in card
    assert _data(ModelCard(card)).language == ["ar"]


def _data(card: ModelCard) -> ModelCardData:
    assert isinstance(card.data, ModelCardData)
    return card.data


def test_pushing_offline_is_one_line(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    from sembridge_ray.sparse.model import push_model

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert run_job(lambda: bool(push_model(model_dir, "someone/sembridge-test"))) == 2
    assert capsys.readouterr().err.strip() == (
        "error: cannot push to the hub repository 'someone/sembridge-test': HF_HUB_OFFLINE is set (offline)"
    )


# ---- the quick-like model
# ---------------------------------------------------------------------------------------


def _copy_with_readme(src: Path, dst: Path, readme: str) -> Path:
    shutil.copytree(src, dst)
    (dst / "README.md").write_text(readme, encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def quick(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inputs and outputs laid out as the quick start's: local inputs that state their licences in
    their own READMEs, the demo's SICK assets materialised under ``assets/`` by the demo's own
    builder, an init output, and a fine-tuning output of it whose card is written by the fine-tuning
    job's provenance."""
    root = tmp_path_factory.mktemp("quick")
    source = _copy_with_readme(
        fixtures_root / "bert-mlm",
        root / "inputs" / "bert-mlm",
        "---\nlicense: apache-2.0\nbase_model: google-bert/bert-base-uncased\n---\n\nA tiny BERT.\n",
    )
    tokenizer = _copy_with_readme(
        fixtures_root / "tok-bytebpe",
        root / "inputs" / "bpe",
        "---\nlanguage: en\nlicense: cc-by-sa-3.0\n---\n\nA byte-level BPE trained on STS text.\n",
    )
    bridge = _copy_with_readme(
        fixtures_root / "bridge", root / "inputs" / "bridge", "---\nlicense: mit\n---\n"
    )
    assets = root / "out" / "assets"
    paths = {
        name: demo.build_asset(assets, name, DemoSettings(test_pairs=100))
        for name in ("sick_train", "dev", "beir")
    }
    init_out = root / "out" / "cells" / "cell" / "init"
    initialise(
        InitConfig(
            source_model=str(source),
            target_tokenizer=str(tokenizer),
            bridge_model=str(bridge),
            output=str(init_out),
            weighting=WeightingConfig(alpha=4.0),
            cache_dir=str(root / "cache"),
            samples=2,
        )
    )
    return {"root": root, "init": init_out / "model", **paths}


def _metrics(beir: Path, ndcg: float, split: str = "test") -> dict[str, object]:
    """metrics.json of an evaluation (the keys the evaluate job writes)."""
    return {
        "nDCG@10": ndcg,
        "RR@10": ndcg + 0.05,
        "R@100": 0.9,
        "num_queries": 61,
        "num_docs": 134,
        "dataset": str(beir),
        "split": split,
    }


def _finished(job: str, model: Path, scores: Mapping[str, object], out: Path) -> Path:
    """A finished output of ``job`` (evaluate or export) that scored ``model``, as the job leaves it:
    its scores file, its identity naming the model's, and ``_SUCCESS``."""
    out.mkdir(parents=True)
    (out / SCORED[job]).write_text(json.dumps(scores), encoding="utf-8")
    inputs = {"model": path_identity(model), "dataset": "sick-beir"}
    identity = RunIdentity(job=job, settings={"out": out.name}, inputs=inputs)
    (out / IDENTITY).write_text(json.dumps(identity.to_dict()), encoding="utf-8")
    write_success(out)
    return out


def _fine_tune(quick: dict[str, Path], out: Path, dev: tuple[float, float]) -> Path:
    """A fine-tuning output of the init model as the fine-tuning job leaves it (its card from
    ``card_provenance``, its identity naming the init model's); the weights are the init model's."""
    model = out / "model"
    shutil.copytree(quick["init"], model, ignore=shutil.ignore_patterns(CARD, PROVENANCE))
    cfg = FinetuneConfig(
        model=str(quick["init"]),
        train=str(quick["sick_train"]),
        eval=str(quick["dev"]),
        eval_split="dev",
        output=str(out),
    )
    history = [{"step": 0, "dev_nDCG@10": dev[0]}, {"step": 3, "loss": 1.5, "dev_nDCG@10": dev[1]}]
    write_card(model, card_provenance(cfg, 3, {"loss": 1.5}, history, 3))
    inputs = {"model": path_identity(quick["init"]), "train": "sick"}
    identity = RunIdentity(job="finetune", settings={"x": 1}, inputs=inputs)
    (out / IDENTITY).write_text(json.dumps(identity.to_dict()), "utf-8")
    write_success(out)
    return model


def _push(out: Path, scores: Sequence[Path], monkeypatch: pytest.MonkeyPatch) -> str:
    """Publish ``out``'s model with ``scores`` to a recorder standing in for the hub: the card it
    was handed, after checking the directory pushed holds every other file of the model as it is."""
    from sembridge_ray.sparse import model as sparse_model

    pushed: list[str] = []

    def push(directory: Path, repo: str) -> str:
        model = out / "model"
        files = {p.relative_to(model) for p in model.rglob("*") if p.is_file()}
        assert {p.relative_to(directory) for p in directory.rglob("*") if p.is_file()} == files
        for rel in files - {Path(CARD)}:
            assert (directory / rel).read_bytes() == (model / rel).read_bytes()
        pushed.append((directory / CARD).read_text(encoding="utf-8"))
        return f"https://hub/{repo}"

    monkeypatch.setattr(sparse_model, "push_model", push)
    assert publish(out, "model", "org/model", [str(s) for s in scores]) == "https://hub/org/model"
    return pushed[-1]


def test_the_quick_models_card_is_publishable(
    quick: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zero, tuned, dev = 0.3127, 0.4481, (0.2513, 0.3359)
    beir = quick["beir"]
    # the zero-shot stage
    zero_out = _finished("evaluate", quick["init"], _metrics(beir, zero), tmp_path / "zero")
    model = _fine_tune(quick, tmp_path / "finetune", dev)
    on_disk, identity = (model / CARD).read_bytes(), output_fingerprint(model)
    tuned_out = _finished("evaluate", model, _metrics(beir, tuned), tmp_path / "tuned")
    text = _push(model.parent, [zero_out, tuned_out], monkeypatch)

    front = yaml.safe_load(text.split("---\n")[1])  # the front matter as any YAML reader sees it
    assert {
        "library_name",
        "pipeline_tag",
        "tags",
        "base_model",
        "language",
        "license",
        "datasets",
    } <= set(front)
    # the card's title
    assert front["model-index"][0]["name"] == text.split("\n# ", 1)[1].split("\n")[0]
    # the hub's parser and metadata validation
    data = _data(ModelCard(text, ignore_metadata_errors=False))
    assert (
        data.library_name == "sentence-transformers" and data.pipeline_tag == "feature-extraction"
    )
    assert {"sentence-transformers", "sparse-encoder", "splade", "sembridge"} <= set(
        data.tags or []
    )
    assert data.language == ["en"]  # the target tokenizer's README
    assert data.base_model == "google-bert/bert-base-uncased"  # the source model's README
    # SICK's own readme states its licence; the card's metadata carries it (the most restrictive
    # input here)
    assert "Attribution-NonCommercial-ShareAlike 3.0" in (sick_dir() / "readme.txt").read_text(
        encoding="utf-8-sig"
    )
    assert data.license == "cc-by-nc-sa-3.0"
    assert "training data: `sick-train-pairs.parquet`: CC BY-NC-SA 3.0" in text
    for role, name, declared in (
        ("source model", "bert-mlm", "apache-2.0"),
        ("bridge model", "bridge", "mit"),
    ):
        # as the fixture's READMEs declare them
        assert f"- {role}: `{name}`: {declared} (its README.md)" in text
    assert "RobZamp/sick" in (data.datasets or [])
    assert "(unknown)" not in text
    assert re.search(
        r"^# SemBridge \(α = 4\) sparse encoder for English: bert-mlm .*fine-tuned on", text, re.M
    )

    name, results = model_index_to_eval_results(data.to_dict()["model-index"])
    assert name == data.model_name

    def score(kind: str, split: str) -> float:
        (found,) = [
            r.metric_value for r in results if r.metric_type == kind and r.dataset_split == split
        ]
        return float(found)

    assert score("ndcg@10", "test") == pytest.approx(tuned, abs=5e-5)
    assert score("ndcg@10-zero-shot", "test") == pytest.approx(zero, abs=5e-5)
    assert score("ndcg@10", "dev") == pytest.approx(dev[1], abs=5e-5)
    assert score("ndcg@10-zero-shot", "dev") == pytest.approx(dev[0], abs=5e-5)
    assert all(isinstance(r, EvalResult) and r.dataset_type == "RobZamp/sick" for r in results)

    for name, written in (
        ("pushed card", text),
        *(
            (str(path), path.read_text(encoding="utf-8"))
            for path in (
                model / CARD,
                model / PROVENANCE,
                quick["init"] / CARD,
                quick["init"] / PROVENANCE,
            )
        ),
    ):
        assert not ABSOLUTE.search(written), (name, ABSOLUTE.search(written))
        assert (
            str(quick["root"]) not in written
            and str(tmp_path) not in written
            and str(Path.home()) not in written
        )

    # publishing wrote nothing into the finished outputs but the push record; the card on disk is
    # checksummed like every other file of the model, and shows no evaluation
    assert (model / CARD).read_bytes() == on_disk and str(tuned) not in on_disk.decode()
    assert is_complete(model.parent) and output_fingerprint(model) == identity
    assert f"model/{CARD}" in read_manifest(model.parent)["files"]  # type: ignore[index]
    assert f"model/{CARD}" in read_manifest(quick["init"].parent)["files"]  # type: ignore[index]
    (record,) = json.loads((model.parent / PUSHED).read_text(encoding="utf-8"))
    assert record["scores"] == [str(zero_out), str(tuned_out)] and record["repo_id"] == "org/model"


def test_an_initialised_models_evaluation_is_on_its_published_card(
    quick: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _finished("evaluate", quick["init"], _metrics(quick["beir"], 0.2718), tmp_path / "e")
    (found,) = scores_of(path_identity(quick["init"]), "", [str(done)]).own
    assert (
        found["metrics"]["nDCG@10"] == pytest.approx(0.2718)
        and found["dataset_id"] == "RobZamp/sick"
    )
    copy = tmp_path / "init"
    shutil.copytree(quick["init"].parent, copy)  # the same run: the same identity, its own record
    card = _data(ModelCard(_push(copy, [done], monkeypatch)))
    _, results = model_index_to_eval_results(card.to_dict()["model-index"])
    assert [r.metric_value for r in results if r.metric_type == "ndcg@10"] == [
        pytest.approx(0.2718)
    ]


def test_scores_of_another_model_or_of_no_finished_output_are_refused_in_one_line(
    quick: dict[str, Path], tmp_path: Path
) -> None:
    """An evaluation names the model it scored by identity: one of another model (another run, or
    a model outside any finished output, identified by its content) is refused at publish time;
    an output that is not a finished evaluation or export is refused before any work."""
    loose = tmp_path / "loose"
    shutil.copytree(quick["init"], loose)
    other = _finished("evaluate", loose, _metrics(quick["beir"], 0.5), tmp_path / "other")
    with pytest.raises(InputError, match=r"^--scores '.*other' scored another model") as err:
        scores_of(path_identity(quick["init"]), "", [str(other)])
    assert "\n" not in str(err.value) and path_identity(quick["init"]) in str(err.value)
    # a fine-tuned model's own and its input model's evaluations are taken, another's is not
    model = path_identity(_fine_tune(quick, tmp_path / "finetune", (0.2, 0.3)))
    started = path_identity(quick["init"])
    zero = _finished("evaluate", quick["init"], _metrics(quick["beir"], 0.25), tmp_path / "zero")
    assert [e["metrics"]["nDCG@10"] for e in scores_of(model, started, [str(zero)]).before] == [
        0.25
    ]
    with pytest.raises(InputError, match="nor the model it was fine-tuned from"):
        scores_of(model, started, [str(zero), str(other)])

    unfinished = _finished("evaluate", quick["init"], _metrics(quick["beir"], 0.3), tmp_path / "u")
    (unfinished / "_SUCCESS").unlink()
    trained = tmp_path / "finetune"
    for named, why in (
        (unfinished, "is not a finished evaluate or export output"),
        (trained, "is not a finished evaluate or export output"),  # finished, but not scores
        (tmp_path / "nowhere", "is not a finished evaluate or export output"),
    ):
        with pytest.raises(InputError, match=re.escape(f"--scores {str(named)!r} {why}")):
            scores_of(model, started, [str(named)])


def test_the_sick_pairs_lose_their_licence_when_copied_or_changed(
    quick: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copied = tmp_path / "pairs.parquet"
    shutil.copy(quick["sick_train"], copied)
    (entry,) = input_licences("training data", str(copied))
    assert entry["licence"] == UNKNOWN and entry["hub"] == "unknown"

    changed = tmp_path / "assets"
    path = demo.build_asset(changed, "sick_train", DemoSettings())
    assert input_licences("training data", str(path))[0]["hub"] == "cc-by-nc-sa-3.0"
    shutil.copy(quick["dev"] / "queries.jsonl", path)  # other content under the marked name
    assert input_licences("training data", str(path))[0]["licence"] == UNKNOWN

    prov = {"init": {"licences": input_licences("source model", str(tmp_path / "nowhere"))}}
    prov["finetune"] = {"licences": input_licences("training data", str(copied))}
    out = tmp_path / "model"
    out.mkdir()
    with caplog.at_level(logging.WARNING, logger="sembridge_ray.model_card"):
        write_card(out, prov)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        len(lines) == 1
        and "pairs.parquet" in lines[0]
        and "nowhere" in lines[0]
        and UNKNOWN in lines[0]
    )
    assert _data(ModelCard.load(out / CARD)).license == "unknown"


def test_a_local_input_declares_its_licence_in_its_readmes_front_matter(tmp_path: Path) -> None:
    """Only an explicit ``license:`` in a README's front matter counts (a directory's own, or the
    README beside a file); a licence only mentioned in the text, or in other metadata, is no
    declaration: unknown."""
    beir = tmp_path / "my-set"
    beir.mkdir()
    (beir / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# My set\n", encoding="utf-8")
    (beir / "pairs.parquet").write_bytes(b"")
    said = tmp_path / "other-set"
    said.mkdir()
    (said / "README.md").write_text("# Other set\n\n- **Licence:** CC BY 4.0\n", encoding="utf-8")
    (said / "dataset_info.json").write_text(json.dumps({"license": "apache-2.0"}), encoding="utf-8")
    (entry,) = input_licences("training data", str(beir))
    assert (entry["hub"], entry["found"]) == ("cc-by-4.0", "its README.md")
    assert input_licences("training data", str(beir / "pairs.parquet"))[0]["hub"] == "cc-by-4.0"
    (unsaid,) = input_licences("training data", str(said))
    assert unsaid["licence"] == UNKNOWN and unsaid["hub"] == "unknown"


def test_a_bundled_dataset_spec_states_the_licence_its_files_carry(tmp_path: Path) -> None:
    """Each part of a joined training spec gets the licence of the files it reads (the notices
    bundled beside them are the oracle); a local copy of the format (@DIR) is not assumed to be
    under the bundled one's terms."""
    notices = asset("data") / "xquad" / "CC-BY-SA4.0.txt", asset("data") / "arcd" / "LICENSE"
    assert "Attribution-ShareAlike 4.0 International" in notices[0].read_text("utf-8")
    assert notices[1].read_text("utf-8").startswith("MIT License")
    entries = input_licences("training data", "xquad:ar+arcd:ar")
    assert [(e["name"], e["hub"]) for e in entries] == [
        ("xquad:ar", "cc-by-sa-4.0"),
        ("arcd:ar", "mit"),
    ]
    assert combined_licence(entries)[0] == "cc-by-sa-4.0"
    (korquad,) = input_licences("development data", "korquad:ko")
    assert "Attribution-NoDerivs 2.0 Korea" in (asset("data") / "korquad" / "NOTICE.md").read_text(
        "utf-8"
    )
    assert korquad["licence"] == "CC BY-ND 2.0 KR"
    (copy,) = input_licences("training data", f"xquad:sw@{tmp_path}")
    assert copy["licence"] == UNKNOWN and copy["name"] == f"xquad:sw@<local mirror {tmp_path.name}>"


@pytest.mark.parametrize(
    ("text", "hub"),
    [
        ("CC BY-NC-SA 3.0 (SICK 2014)", "cc-by-nc-sa-3.0"),
        ("CC BY-NC-SA 4.0", "cc-by-nc-sa-4.0"),
        ("Apache 2.0 (all-MiniLM-L6-v2)", "apache-2.0"),
        ("MIT", "mit"),
        ("cc-by-sa-4.0", "cc-by-sa-4.0"),
        ("CC BY-NC-SA 3.0 (SICK 2014) and the STS 2012–2013 terms", "other"),
        ("a licence of our own", "other"),
        (UNKNOWN, "unknown"),
    ],
)
def test_licences_map_to_the_hubs_ids(text: str, hub: str) -> None:
    assert hub_licence(text) == hub


def test_the_most_restrictive_licence_applies() -> None:
    def entries(*hubs: str) -> list[InputLicence]:
        return [{"role": "r", "name": h, "licence": h, "hub": h, "found": ""} for h in hubs]

    assert combined_licence(entries("apache-2.0", "mit", "cc-by-nc-sa-3.0"))[0] == "cc-by-nc-sa-3.0"
    assert combined_licence(entries("apache-2.0", "mit"))[0] == "apache-2.0"
    # two share-alikes
    assert combined_licence(entries("cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0"))[0] == "other"
    assert combined_licence(entries("apache-2.0", "unknown"))[0] == "unknown"


def test_a_manifest_leaves_out_the_named_files(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    for name in ("model/w.bin", "model/README.md", "report.json"):
        (tmp_path / name).write_text(name, encoding="utf-8")
    files = write_success(tmp_path, exclude=("model/README.md",))["files"]
    assert set(files) == {"model/w.bin", "report.json"}
    (tmp_path / "model" / "README.md").write_text("changed", encoding="utf-8")
    assert is_complete(tmp_path)


def _export_report(target: str, ndcg_target: float, passed: bool) -> ExportReport:
    """An ``export_report.json`` as the export job writes it (the keys the card reads, and more)."""
    return {
        "target": target,
        "model": "model",
        "dataset": "sick-beir",
        "split": "test",
        "documents": 80,
        "postings": 1234,
        "queries": 40,
        "overlap@10": 1.0 if passed else 0.8,
        "identical_up_to_ties": 1.0 if passed else 0.5,
        "ndcg@10_exact": 0.5,
        "ndcg@10_target": ndcg_target,
        "passed": passed,
    }


def test_an_exports_parity_joins_the_card_beside_its_evaluations(
    quick: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 36, 2, at publish time: an export's parity is on the card (one row per target,
    dataset and split; of two of the same, the one named last), beside the evaluations."""
    model, beir = quick["init"], quick["beir"]
    named = [
        _finished("evaluate", model, _metrics(beir, 0.4321), tmp_path / "eval"),
        _finished("export", model, _export_report("qdrant", 0.5, True), tmp_path / "q1"),
        _finished("export", model, _export_report("pisa", 0.4567, False), tmp_path / "pisa"),
        _finished(
            "export", model, _export_report("qdrant", 0.5, True) | {"queries": 7}, tmp_path / "q2"
        ),
    ]
    found = scores_of(path_identity(model), "", [str(n) for n in named])
    assert [(e["target"], e["queries"]) for e in found.exports] == [("qdrant", 7), ("pisa", 40)]
    card = render(read_provenance(model), found.own, found.exports, found.before)
    assert "## Exports" in card
    assert "| `qdrant` | sick-beir | test | 7 | 1.0000 | 0.5000 | 0.5000 | yes |" in card
    assert "| `pisa` | sick-beir | test | 40 | 0.8000 | 0.5000 | 0.4567 | **no** |" in card
    assert card.count("| `qdrant` |") == 1 and "| sick-beir (" in card and "| 0.4321 |" in card
    # a card without exports has no such section
    assert "## Exports" not in (model / CARD).read_text(encoding="utf-8")


def test_the_card_shows_each_evaluations_health_and_flags_a_collapse(
    quick: dict[str, Path],
) -> None:
    """Issue 40, 3: beside its scores, the card shows the mean active dimensions and the empty
    shares of each evaluation, and says which collapsed (queries outside the band)."""
    healthy = {"nDCG@10": 0.5, "mean_active_dims_query": 23.4, "mean_active_dims_doc": 86.0}
    silent = {
        "nDCG@10": 0.0,
        "mean_active_dims_query": 2.0,
        "mean_active_dims_doc": 3.0,
        "empty_share_query": 0.25,
        "empty_share_doc": 0.5,
    }
    scores = [
        evaluation("xquad:ru", "xquad:ru", "test", healthy),
        evaluation("xquad:ru", "xquad:ru", "dev", silent),
    ]
    card = render(read_provenance(quick["init"]), scores)
    assert "### Health of the vectors" in card
    assert "| xquad:ru | test | 23.4 / 86 | 0.0% / 0.0% | no |" in card
    assert (
        "| xquad:ru | dev | 2 / 3 | 25.0% / 50.0% | **yes**: queries fire on 2.0 terms (< 5) |"
        in card
    )
