"""The reproduction driver's plan: cells, names, the dry run's hub ids; and the cluster configs
match its flags."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from jobs import reproduce
from sembridge_ray import catalog, languages
from sembridge_ray.cli import parse_config
from sembridge_ray.recipes import job_spec
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce import grid as driver
from sembridge_ray.recipes.reproduce.cells import expand, parse_alpha
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.recipes.reproduce.stages import Stage
from sembridge_ray.runtime.config import ConfigError
from sembridge_ray.sparse.config import OptimConfig
from tests.conftest import REPO


def test_cells_are_deterministic_and_baselines_have_no_alpha() -> None:
    cells = expand(
        ("naver/splade-v3",), ("ko", "ar"), ("sembridge", "focus"), ("2", "4", "softmax")
    )
    assert [c.name for c in cells] == [
        "splade-v3__ko__sembridge__a2",
        "splade-v3__ko__sembridge__a4",
        "splade-v3__ko__sembridge__a1",
        "splade-v3__ko__focus",
        "splade-v3__ar__sembridge__a2",
        "splade-v3__ar__sembridge__a4",
        "splade-v3__ar__sembridge__a1",
        "splade-v3__ar__focus",
    ]
    assert parse_alpha("softmax") == 1.0 and cells[2].alpha_label == "softmax"


def test_paper_dry_run_names_every_hub_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        reproduce.main(["--preset", "paper", "--dry-run", "--json", "--output", str(tmp_path)]) == 0
    )
    text = capsys.readouterr().out
    plan = json.loads(text)
    # 4 models x 5 languages x (sembridge α=4 + 4 baselines)
    assert plan["total_cells"] == 4 * 5 * 5
    for hub in [
        *catalog.SOURCE_MODELS.values(),
        "BAAI/bge-m3",
        *(row.hub_tokenizer for row in languages.LANGUAGES),
        "PaDaS-Lab/webfaq-retrieval",
        "miracl/miracl",
        "miracl/miracl-corpus",
    ]:
        assert hub in text
    assert {c["language"] for c in plan["cells"]} == {"ar", "zh", "hi", "ko", "ru"}
    # contacted and wrote nothing
    assert plan["estimate_gpu_hours"] > 0 and not list(tmp_path.iterdir())


def test_flags_override_the_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--preset",
        "paper",
        "--dry-run",
        "--json",
        "--output",
        str(tmp_path),
        "--model",
        "naver/splade-v3",
        "--languages",
        "ko",
        "--datasets",
        "miracl",
        "--methods",
        "sembridge",
        "--alphas",
        "2,3,4,softmax",
    ]
    assert reproduce.main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [c["alpha"] for c in plan["cells"]] == ["2", "3", "4", "softmax"]
    assert all(set(c["datasets"]) == {"miracl"} for c in plan["cells"])


def test_demo_preset_loads() -> None:
    cfg, _ = parse_config(ReproduceConfig, ["--preset", "demo"], job="reproduce")
    assert cfg.preset == "demo" and cfg.init.bridge_model == "minilm" and not cfg.init.copy_overlap
    assert set(cfg.methods) >= {
        "sembridge",
        "focus",
        "wechsel",
        "mean",
        "random",
    } and cfg.alphas == ("4", "2")


def _entrypoint_config(entrypoint: str, output: Path) -> ReproduceConfig:
    words = shlex.split(entrypoint)
    assert words[:3] == ["python", "-m", "jobs.reproduce"]
    args = [w if not w.startswith("/") else str(output) for w in words[3:]]
    spec = job_spec("reproduce")
    return parse_config(
        ReproduceConfig, args, flags=spec.flags, job="reproduce", default_preset="paper"
    )[0]


def test_kuberay_rayjob_matches_the_driver(tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "cluster" / "kuberay-rayjob.yaml").read_text())
    assert job["kind"] == "RayJob" and job["spec"]["shutdownAfterJobFinishes"] is True
    cfg = _entrypoint_config(job["spec"]["entrypoint"], tmp_path)
    assert cfg.preset == "paper"
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    gpus = sum(
        int(g["replicas"])
        * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        for g in groups
    )
    # the concurrency the entrypoint asks for fits
    assert gpus >= cfg.gpus_per_cell * cfg.max_concurrent
    assert (
        job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"]
        == "0.0.0.0"
    )


def test_aws_launcher_installs_the_package_on_gpu_workers() -> None:
    launcher = yaml.safe_load((REPO / "cluster" / "aws-gpu.yaml").read_text())
    worker = launcher["available_node_types"]["gpu_worker"]
    assert worker["resources"]["GPU"] >= 1 and worker["max_workers"] >= worker["min_workers"] >= 1
    assert any("pip install" in c and "sembridge_ray" in c for c in launcher["setup_commands"])
    assert launcher["head_node_type"] in launcher["available_node_types"]


def test_runtime_env_keeps_outputs_and_venv_out() -> None:
    env = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    assert env["working_dir"] == "."
    assert {".venv/", "outputs/"} <= set(env["excludes"]) and any(
        "__pycache__" in e for e in env["excludes"]
    )


@pytest.mark.parametrize(
    ("gpus_per_cell", "gpus", "max_concurrent", "width", "workers", "gpus_per_worker"),
    [
        (1.0, 8, 0, 8, 1, 1.0),  # one GPU per cell, as many cells as GPUs
        (2.0, 8, 0, 4, 2, 1.0),  # two single-GPU DDP workers per cell
        (0.5, 2, 0, 4, 1, 0.5),  # two cells share a GPU
        (1.0, 8, 3, 3, 1, 1.0),  # --max-concurrent wins
        (1.0, 0, 0, 1, 2, None),  # no GPUs: one cell at a time, the stage's own resources
    ],
)
def test_concurrency_and_cell_resources(
    gpus_per_cell: float,
    gpus: float,
    max_concurrent: int,
    width: int,
    workers: int,
    gpus_per_worker: float | None,
) -> None:
    from sembridge_ray.recipes.reproduce.plan import concurrency
    from sembridge_ray.recipes.reproduce.stages import cell_resources
    from sembridge_ray.runtime.placement import ResourceConfig

    cfg = ReproduceConfig(gpus_per_cell=gpus_per_cell, max_concurrent=max_concurrent)
    assert concurrency(cfg, gpus) == width
    res = cell_resources(cfg, ResourceConfig(workers=2), gpus)
    assert (res.workers, res.gpus_per_worker) == (workers, gpus_per_worker)
    assert width * gpus_per_cell <= gpus or max_concurrent or gpus == 0  # the cells fit the GPUs


def test_the_position_aware_variant_is_a_row_of_its_own_with_its_init_setting(
    tmp_path: Path,
) -> None:
    from sembridge_ray.recipes.init.config import InitConfig
    from sembridge_ray.recipes.reproduce.compare import comparisons
    from sembridge_ray.recipes.reproduce.stages import Assets, cell_stages

    cfg = ReproduceConfig(
        models=("m",),
        languages=("ko",),
        datasets=("miracl",),
        methods=("sembridge+pa", "sembridge", "focus"),
    )
    cells = expand(cfg.models, cfg.languages, cfg.methods, cfg.alphas)
    assert [(c.name, c.variant, c.position_aware) for c in cells] == [
        ("m__ko__sembridge+pa__a4", "sembridge+pa", True),
        ("m__ko__sembridge__a4", "sembridge", False),
        ("m__ko__focus", "focus", False),
    ]
    assets = Assets(
        models={"m": "src"}, tokenizers={"ko": "tok"}, specs={("miracl", "ko"): ("eval", "train")}
    )
    inits = [
        cell_stages(
            replace(cfg, output=str(tmp_path)), c, assets, 0.0, lambda kind, name: f"{kind}:{name}"
        )[0].cfg
        for c in cells
    ]
    assert all(isinstance(i, InitConfig) for i in inits)
    assert [(i.method, i.weighting.position_aware) for i in inits if isinstance(i, InitConfig)] == [
        ("sembridge", True),
        ("sembridge", False),
        ("focus", False),
    ]
    # the plain sembridge cell is the reference of the paired comparisons, even when +pa is listed
    # first
    for cell in cells:
        out = tmp_path / "cells" / cell.name / "miracl" / "zero_shot"
        out.mkdir(parents=True)
        (out / "per_query.tsv").write_text("query_id\tnDCG@10\nq1\t0.5\nq2\t0.25\n")
    rows = comparisons(tmp_path, cells, ["miracl"])
    assert {r["reference"] for r in rows} == {"m__ko__sembridge__a4"}
    assert sorted(r["method"] for r in rows if r["stage"] == "zero_shot") == [
        "focus",
        "sembridge+pa",
    ]
    with pytest.raises(ConfigError, match="'\\+pa' needs a method that uses the bridge"):
        ReproduceConfig(methods=("mean+pa",))


def test_a_figures_file_is_scaled_and_the_rates_it_lacks_stay_built_in(tmp_path: Path) -> None:
    from sembridge_ray.recipes.reproduce import plan as plan_mod
    from sembridge_ray.recipes.reproduce.figures import BUILT_IN, plan_figures, read_figures

    assert plan_figures("", 64) == BUILT_IN
    measured = tmp_path / "measured.json"
    measured.write_text(
        json.dumps(
            {
                "source": "bench on cpu",
                "device": "cpu",
                "docs_per_s": 10.0,
                "train_examples_per_s": 4.0,
                "gpu_scale": 50.0,
                "scaling": "CPU x 50 (assumed)",
            }
        )
    )
    figures = read_figures(measured, 64)
    assert plan_figures(str(measured), 64) == figures
    assert (figures.docs_per_s, figures.seconds_per_step) == (500.0, 64 / 200.0)
    assert figures.bridge_strings_per_s == BUILT_IN.bridge_strings_per_s
    assert (
        "bench on cpu" in figures.source
        and str(measured) in figures.source
        and "CPU x 50" in figures.source
    )
    assert "built-in: bridge_strings_per_s" in figures.source
    cell = expand(("naver/splade-v3",), ("ko",), ("sembridge",), ("4",))[0]
    est = plan_mod.cell_estimate(cell, ["miracl"], 1.0, 64, figures)
    docs = languages.dataset_size("miracl", "ko").passages
    assert est["eval_s"] == pytest.approx(2 * docs / 500.0)
    assert est["finetune_s"] == pytest.approx(
        languages.dataset_size("miracl", "ko").train_queries / 64 * 64 / 200.0
    )
    out = plan_mod.plan(
        [cell], ["miracl"], {"ko": "t"}, "b", 1.0, 64, 1.0, 1, figures, lambda c: {"init": tmp_path}
    )
    assert out["figures_source"] == figures.source


GRID = [
    "--preset",
    "paper",
    "--dry-run",
    "--json",
    "--model",
    "naver/splade-v3",
    "--languages",
    "ko",
]
GRID += [
    "--datasets",
    "miracl",
    "--methods",
    "sembridge",
    "finetune.optim.epochs=2",
    "finetune.optim.batch_size=32",
]


def _hand_estimate_hours(bridge_per_s: float, docs_per_s: float, train_s: float) -> float:
    """One cell, every stage to run: the init's 60,000 bridge-encoder strings
    (``plan.cell_estimate``'s assumption), MIRACL-ko's corpus encoded twice (zero-shot and
    fine-tuned), 2 epochs over its training queries; ``train_s``: seconds per training example."""
    docs, queries = (
        languages.dataset_size("miracl", "ko").passages,
        languages.dataset_size("miracl", "ko").train_queries,
    )
    return (60_000 / bridge_per_s + 2 * docs / docs_per_s + 2 * queries * train_s) / 3600


def test_the_dry_run_divides_by_the_figures_file_it_is_given_and_by_nothing_it_finds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``--figures`` the built-in figures, even where a benchmark left files in the cache
    the plan once read; with it, the file's: both estimates as computed by hand from their
    throughputs."""
    home = tmp_path / "home"
    cache = home / ".cache" / "sembridge_ray"
    cache.mkdir(parents=True)
    rates = {"bridge_strings_per_s": 1500.0, "docs_per_s": 400.0, "train_examples_per_s": 80.0}
    for name in ("gpu_figures.json", "measured.json"):
        (cache / name).write_text(json.dumps({"source": "left behind", **rates}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SEMBRIDGE_GPU_FIGURES", str(cache / "gpu_figures.json"))

    assert reproduce.main([*GRID, "--output", str(tmp_path / "a")]) == 0
    built_in = json.loads(capsys.readouterr().out)
    assert (
        "built-in" in built_in["figures_source"] and "left behind" not in built_in["figures_source"]
    )
    # the built-in figures: 3,000 strings/s, 1,000 docs/s, 0.35 s per step (of the plan's batch, 32
    # here)
    assert built_in["estimate_gpu_hours"] == pytest.approx(
        _hand_estimate_hours(3000, 1000, 0.35 / 32), abs=0.005
    )

    given = tmp_path / "figures.json"
    given.write_text(json.dumps({"source": "measured on a test GPU", "gpu": "X", **rates}))
    assert reproduce.main([*GRID, "--output", str(tmp_path / "a"), "--figures", str(given)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (
        plan["figures_source"].startswith("measured on a test GPU")
        and str(given) in plan["figures_source"]
    )
    assert plan["assumptions"]["seconds_per_step"] == pytest.approx(32 / 80.0)
    assert plan["estimate_gpu_hours"] == pytest.approx(
        _hand_estimate_hours(1500, 400, 1 / 80.0), abs=0.005
    )
    assert plan["estimate_gpu_hours"] != built_in["estimate_gpu_hours"]


@pytest.mark.parametrize(
    "content",
    [
        None,  # missing
        "\xff\xfe",  # not UTF-8
        "not json",
        "[1, 2]",
        '{"gpu": "x"}',  # none of the throughputs
        '{"docs_per_s": 0}',
        '{"docs_per_s": "fast"}',
        '{"docs_per_s": 5, "gpu_scale": -1}',
    ],
)
@pytest.mark.parametrize("job", ["reproduce", "init"])
def test_a_bad_figures_file_is_refused_in_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, job: str
) -> None:
    from sembridge_ray.cli import run
    from tests.conftest import error_lines

    path = tmp_path / "figs.json"
    if content is not None:
        path.write_bytes(content.encode("latin-1"))
    args = ["--dry-run", "--figures", str(path), "--output", str(tmp_path / "out")]
    if job == "reproduce":
        code = reproduce.main([*GRID, *args])
    else:
        code = run(
            "init",
            [*args, "--model", "m", "--target-tokenizer", languages.language("ko").hub_tokenizer],
        )
    said = error_lines(capsys)
    assert (
        code == 2 and len(said) == 1 and said[0].startswith("error: ") and str(path) in said[0]
    ), said
    assert not (tmp_path / "out").exists()


def test_figures_without_a_dry_run_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import error_lines

    path = tmp_path / "figs.json"
    path.write_text('{"docs_per_s": 5}')
    assert (
        reproduce.main(
            ["--preset", "demo", "--output", str(tmp_path / "out"), "--figures", str(path)]
        )
        == 2
    )
    said = error_lines(capsys)
    assert len(said) == 1 and "figures" in said[0] and "--dry-run" in said[0], said
    assert not (tmp_path / "out").exists()


def _planned(cfg: ReproduceConfig, root: Path) -> tuple[driver.Plan, dict[str, Path]]:
    """The plan of ``cfg`` at ``root`` with stand-in asset paths and identities ("kind:name"):
    nothing is read."""
    files = {name: root / "assets" / asset.path for name, asset in demo.ASSETS.items()}
    cfg = replace(cfg, output=str(root))
    identify = driver.Identities(compute=lambda kind, name: f"{kind}:{name}")
    return driver.plan(cfg, 0.0, files=files, identify=identify), files


def _tunes(planned: driver.Plan) -> list[tuple[FinetuneConfig, dict[str, str]]]:
    """Every cell's fine-tuning: its config and inputs."""
    stages = [s for cell in planned.cells.values() for s in cell if s.job == "finetune"]
    return [(s.cfg, s.inputs) for s in stages if isinstance(s.cfg, FinetuneConfig)]


def _evaluate(stage: Stage) -> EvaluateConfig:
    assert isinstance(stage.cfg, EvaluateConfig)
    return stage.cfg


def test_the_demo_fine_tunes_scored_on_the_trial_dev_set_and_scores_its_source_there_once(
    tmp_path: Path,
) -> None:
    cfg, _ = parse_config(ReproduceConfig, ["--preset", "demo"], job="reproduce")
    planned, files = _planned(cfg, tmp_path)
    dev = str(files["dev"])
    source, source_eval = planned.assets
    # the source's recipe is fixed
    assert isinstance(source.cfg, FinetuneConfig) and source.cfg.eval == ""
    assert _evaluate(source_eval).split == "test"
    (source_dev,) = planned.sources
    scored = _evaluate(source_dev)
    assert (scored.model, scored.dataset, scored.split) == (f"{source.output}/model", dev, "dev")
    assert source_dev.output == tmp_path / "sources" / "minilm-splade" / "dev"
    assert source_dev.inputs == {"model": f"{source.ref}/model", "dataset": f"dataset:{dev}"}
    tunes = _tunes(planned)
    assert len(tunes) == len(planned.cells) == 6  # sembridge α=4, α=2 and the four baselines
    for tune, inputs in tunes:
        assert (tune.eval, tune.eval_split, inputs["eval"]) == (dev, "dev", f"dataset:{dev}")
        assert tune.train == str(files["sick_train"])
    splits = {
        _evaluate(s).split for cell in planned.cells.values() for s in cell if s.job == "evaluate"
    }
    assert splits == {"test"}  # the test judgements only score before and after


def test_hub_cells_have_a_dev_set_only_when_finetune_eval_names_one(tmp_path: Path) -> None:
    base = ReproduceConfig(
        models=("naver/splade-v3", "m2"),
        languages=("ko",),
        datasets=("miracl",),
        methods=("focus",),
    )
    planned, _ = _planned(base, tmp_path)
    assert planned.sources == [] and all(
        t.eval == "" and "eval" not in i for t, i in _tunes(planned)
    )
    # MIRACL dev is what the cells are scored on
    dev = replace(base.finetune, eval="miracl:ko", eval_split="train")
    planned, _ = _planned(replace(base, finetune=dev), tmp_path)
    assert [
        (_evaluate(s).model, s.output.relative_to(tmp_path).as_posix()) for s in planned.sources
    ] == [
        ("naver/splade-v3", "sources/splade-v3/dev"),
        ("m2", "sources/m2/dev"),
    ]
    tunes = _tunes(planned)
    assert len(tunes) == 2 and all(
        t.eval == "miracl:ko" and i["eval"] == "dataset:miracl:ko" for t, i in tunes
    )


def test_the_convergence_preset_runs_the_settings_cells_long_enough(tmp_path: Path) -> None:
    settings, _ = parse_config(ReproduceConfig, ["--preset", "settings"], job="reproduce")
    cfg, _ = parse_config(ReproduceConfig, ["--preset", "convergence"], job="reproduce")
    assert (cfg.languages, cfg.methods, cfg.alphas) == (
        settings.languages,
        settings.methods,
        settings.alphas,
    )
    assert (cfg.finetune.optim.batch_size, cfg.finetune.optim.max_steps) == (32, 300)
    assert (cfg.finetune.eval_every, cfg.finetune.log_every) == (30, 10)
    # the run really takes 300 steps: epochs of SICK train's pairs (the stream's rule) do not stop
    # it first
    per_epoch = len(demo.sick_pairs()) // cfg.finetune.optim.batch_size
    assert cfg.finetune.optim.max_steps is not None
    assert min(per_epoch * cfg.finetune.optim.epochs, cfg.finetune.optim.max_steps) == 300


def test_sembridge_plus_and_fvt_are_cells_of_the_grid_with_the_recipe_in_their_init(
    tmp_path: Path,
) -> None:
    from sembridge_ray.embed_init.methods import SEMBRIDGE_PLUS
    from sembridge_ray.recipes.init.config import InitConfig
    from sembridge_ray.recipes.reproduce.stages import Assets, cell_stages

    settings, _ = parse_config(ReproduceConfig, ["--preset", "settings"], job="reproduce")
    cfg = replace(settings, languages=("en-bpe",), methods=("sembridge_plus", "fvt", "sembridge"))
    cells = expand(cfg.models, cfg.languages, cfg.methods, cfg.alphas)
    assert [c.name for c in cells] == [
        "minilm-splade__en-bpe__sembridge_plus__a4",
        "minilm-splade__en-bpe__fvt",
        "minilm-splade__en-bpe__sembridge__a4",
    ]
    assets = Assets(
        models={"minilm-splade": "src"},
        tokenizers={"en-bpe": "tok"},
        specs={("sick", "en-bpe"): ("e", "t")},
    )
    inits = [
        cell_stages(
            replace(cfg, output=str(tmp_path)), c, assets, 0.0, lambda kind, name: f"{kind}:{name}"
        )[0].cfg
        for c in cells
    ]
    plus_init, fvt_init, faithful = (i for i in inits if isinstance(i, InitConfig))
    assert all(getattr(plus_init.weighting, k) == v for k, v in SEMBRIDGE_PLUS.items())
    assert plus_init.identity("init", {}).settings != faithful.identity("init", {}).settings
    assert fvt_init.method == "fvt" and not fvt_init.weighting.position_aware
    with pytest.raises(ConfigError, match="position-aware already"):
        ReproduceConfig(methods=("sembridge_plus+pa",))


def test_the_dry_run_prints_a_summary_and_counts_finished_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sembridge_ray.recipes.reproduce.plan import cell_stage_outputs
    from sembridge_ray.runtime.manifest import write_success

    args = [
        "--preset",
        "paper",
        "--dry-run",
        "--output",
        str(tmp_path),
        "--model",
        "naver/splade-v3",
    ]
    args += ["--languages", "ko", "--datasets", "miracl", "--methods", "sembridge,random"]
    cells = expand(("naver/splade-v3",), ("ko",), ("sembridge", "random"), ("4",))
    init = cell_stage_outputs(tmp_path, cells[0], ["miracl"])["init"]
    init.mkdir(parents=True)
    (init / "init_report.json").write_text("{}")
    write_success(init)  # one finished stage: the first cell's init
    slow_bridge = tmp_path / "figures.json"  # an init long enough to show in the rounded hours
    slow_bridge.write_text(json.dumps({"bridge_strings_per_s": 10.0}))  # the other two: built-in
    args += ["--figures", str(slow_bridge)]
    assert reproduce.main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [c["stages"] for c in plan["cells"]] == [
        {
            "init": "done",
            "miracl/zero_shot": "todo",
            "miracl/finetune": "todo",
            "miracl/finetuned": "todo",
        },
        {
            "init": "todo",
            "miracl/zero_shot": "todo",
            "miracl/finetune": "todo",
            "miracl/finetuned": "todo",
        },
    ]
    assert (plan["stages_done"], plan["stages_todo"], plan["job"]) == (1, 7, "reproduce")
    first, second = plan["cells"]
    # the finished init is not counted again
    assert first["estimate_gpu_hours"] < second["estimate_gpu_hours"]
    assert reproduce.main(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["cell", "language", "method", "α", "stages", "done/todo", "GPU-h"]
    assert table[2].split()[:5] == [cells[0].name, "ko", "sembridge", "4", "1/3"]
    assert any(
        line.startswith("reproduce plan: 2 cell(s), 1 stage(s) done, 7 to run") for line in table
    )
    assert any(plan["figures_source"] in line for line in table)


def test_init_has_the_same_plan_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sembridge_ray.cli import run

    out = tmp_path / "init-ko"
    args = [
        "--model",
        "naver/splade-v3",
        "--target-tokenizer",
        languages.language("ko").hub_tokenizer,
        "--output",
        str(out),
    ]
    assert run("init", [*args, "--dry-run", "--json"]) == 0
    init_plan = json.loads(capsys.readouterr().out)
    assert (
        reproduce.main(
            ["--preset", "paper", "--dry-run", "--json", "--output", str(tmp_path / "grid")]
        )
        == 0
    )
    grid_plan = json.loads(capsys.readouterr().out)
    assert list(init_plan) == list(grid_plan) and list(init_plan["cells"][0]) == list(
        grid_plan["cells"][0]
    )
    cell = init_plan["cells"][0]
    assert (cell["language"], cell["stages"], init_plan["job"]) == ("ko", {"init": "todo"}, "init")
    assert init_plan["estimate_gpu_hours"] >= 0 and not out.exists()  # nothing written


def test_the_miniatures_dry_run_refuses_what_its_run_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "--preset",
        "demo",
        "--dry-run",
        "--json",
        "--output",
        str(tmp_path),
        "--languages",
        "en-bpe,en-xx",
    ]
    assert reproduce.main(args) == 2
    assert (
        "demo language 'en-xx': name its tokenizer with target_tokenizers=en-xx=DIR"
        in capsys.readouterr().err
    )
    assert reproduce.main([*args, "target_tokenizers=en-xx=/some/dir"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {c["language"]: c["target_tokenizer"] for c in plan["cells"]}["en-xx"] == "/some/dir"


@pytest.mark.parametrize("language", ["x/../../../escape", "..", "ko/..", ".hidden", "a b", ""])
def test_values_that_name_directories_cannot_leave_the_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], language: str
) -> None:
    """A language names a cell's directory: one with ``/`` or ``..`` once wrote a cell outside
    ``--output``."""
    from tests.conftest import error_lines

    root = tmp_path / "grid" / "root"
    argv = ["--preset", "demo", "--output", str(root), "--languages", f"en-bpe,{language}"]
    argv += [f"target_tokenizers={language}=tok"]
    assert reproduce.main(argv) == 2
    said = error_lines(capsys)
    assert len(said) == 1 and said[0].startswith("error: ") and "names directories" in said[0], said
    # refused before anything is written, inside the root or outside it
    assert list(tmp_path.iterdir()) == []


def test_a_stage_that_resolves_outside_the_root_is_refused(tmp_path: Path) -> None:
    from sembridge_ray.recipes.init.config import InitConfig
    from sembridge_ray.recipes.reproduce.stages import require_under
    from sembridge_ray.runtime.errors import InputError

    root = tmp_path / "root"
    (tmp_path / "elsewhere").mkdir()
    (root / "cells").mkdir(parents=True)
    (root / "cells" / "link").symlink_to(tmp_path / "elsewhere")
    inside = Stage(
        name="init",
        job="init",
        cfg=InitConfig(output=str(root / "cells" / "c" / "init")),
        inputs={},
    )
    require_under(root, inside)
    for escape in (root / "cells" / ".." / ".." / "other", root / "cells" / "link" / "init"):
        stage = Stage(name="init", job="init", cfg=InitConfig(output=str(escape)), inputs={})
        with pytest.raises(InputError, match="outside --output"):
            require_under(root, stage)


def test_the_dry_run_predicts_which_stages_a_run_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage whose output holds a run of other settings is refused by the run: its dry run says
    so, naming the settings (issue 33, 13), and with ``--overwrite`` counts it to redo."""
    from sembridge_ray.recipes.reproduce.plan import cell_stage_outputs, planned_identities
    from sembridge_ray.runtime.identity import RunIdentity
    from sembridge_ray.runtime.manifest import write_success
    from sembridge_ray.runtime.outputs import IDENTITY

    args = [
        "--preset",
        "paper",
        "--dry-run",
        "--output",
        str(tmp_path),
        "--model",
        "naver/splade-v3",
    ]
    args += ["--languages", "ko", "--datasets", "miracl", "--methods", "sembridge"]
    cfg, _ = parse_config(ReproduceConfig, args, flags=job_spec("reproduce").flags, job="reproduce")
    (cell,) = expand(("naver/splade-v3",), ("ko",), ("sembridge",), ("4",))
    outputs = cell_stage_outputs(tmp_path, cell, ["miracl"])
    planned = planned_identities(cfg)(cell)
    # one of other settings, one the same
    for stage, alpha in (("init", 2.0), ("miracl/zero_shot", None)):
        settings = dict(planned[stage].settings) | ({"weighting.alpha": alpha} if alpha else {})
        outputs[stage].mkdir(parents=True)
        recorded = RunIdentity(job=planned[stage].job, settings=settings)
        (outputs[stage] / IDENTITY).write_text(json.dumps(recorded.to_dict()))
        write_success(outputs[stage])
    assert reproduce.main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (row,) = plan["cells"]
    assert row["stages"] == {
        "init": "refused",
        "miracl/zero_shot": "done",
        "miracl/finetune": "todo",
        "miracl/finetuned": "todo",
    }
    assert row["refusals"] == {"init": "weighting.alpha: 2.0 → 4.0"}
    assert (plan["stages_done"], plan["stages_todo"], plan["stages_refused"]) == (1, 2, 1)
    assert reproduce.main(args) == 0
    table = capsys.readouterr().out
    assert f"  {cell.name}/init: weighting.alpha: 2.0 → 4.0" in table and "1 refused" in table
    assert reproduce.main([*args, "--json", "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["stages"]["init"] == "todo"
    # recorded in another identity format: refused whatever its settings, naming both versions
    stage = "miracl/zero_shot"
    older = replace(planned[stage], format_version=None)
    (outputs[stage] / IDENTITY).write_text(json.dumps(older.to_dict()))
    assert reproduce.main([*args, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["cells"]
    assert row["stages"][stage] == "refused"
    assert row["refusals"][stage] == (
        "its identity.json has no format version, this version records format version "
        f"{planned[stage].format_version}"
    )
    assert reproduce.main([*args, "--json", "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["stages"][stage] == "todo"


def test_the_cross_lingual_preset_plans_every_language_with_its_own_sets_and_the_controls(
    tmp_path: Path,
) -> None:
    """xling: per language its tokenizer, XQuAD (KorQuAD for ko) test to score, its training
    articles (plus CMRC or ARCD) to fine-tune on, its development articles while it trains; the
    bundled splade-tiny scored on English XQuAD as it is; sembridge at α 4 and 2 once each, and the
    wrong-bridge control through MiniLM; three seeds for the released rule and the strongest
    baselines."""
    from sembridge_ray.recipes.init.config import InitConfig

    cfg, _ = parse_config(ReproduceConfig, ["--preset", "xling"], job="reproduce")
    assert cfg.models == ("splade-tiny",) and cfg.seeds == 3
    planned, files = _planned(cfg, tmp_path)
    assert len(planned.cells) == 5 * 11 and not planned.failures
    (source_eval,) = planned.assets  # splade-tiny is not trained first
    assert (_evaluate(source_eval).model, _evaluate(source_eval).dataset) == (
        "splade-tiny",
        "xquad:en",
    )
    (source_dev,) = planned.sources
    assert (_evaluate(source_dev).dataset, _evaluate(source_dev).split) == ("xquad:en", "dev")
    for lang, (spec, train) in {
        "zh": ("xquad:zh", "xquad:zh+cmrc2018:zh"),
        "ar": ("xquad:ar", "xquad:ar+arcd:ar"),
        "ko": ("korquad:ko", "korquad:ko"),
        "ru": ("xquad:ru", "xquad:ru"),
    }.items():
        stages = {s.name: s for s in planned.cells[f"splade-tiny__{lang}__sembridge__a4"]}
        init, tune = stages["init"].cfg, stages["xquad/finetune"].cfg
        assert isinstance(init, InitConfig) and isinstance(tune, FinetuneConfig)
        assert (init.source_model, init.target_tokenizer, init.bridge_model) == (
            "splade-tiny",
            f"tok-{lang}",
            "me5",
        )
        assert (init.language, init.copy_overlap) == (lang, True)
        assert _evaluate(stages["xquad/zero_shot"]).dataset == spec
        assert _evaluate(stages["xquad/finetuned"]).dataset == spec
        assert (tune.train, tune.eval, tune.eval_split) == (train, spec, "dev")
        assert tune.eval_at == (0, 1, 2, 4, 8, 16, 32) and "seed-2/xquad/finetune" in stages
    seeded = {
        c.split("__")[2] for c, st in planned.cells.items() if any("seed-1" in s.name for s in st)
    }
    assert seeded == {"sembridge", "sembridge_x", "random", "wechsel", "focus"}
    alphas = sorted(
        (s[0].cfg.weighting.alpha, s[0].cfg.bridge_model)  # type: ignore[attr-defined]
        for name, s in planned.cells.items()
        if name.split("__")[2] in ("sembridge", "sembridge@minilm")
        and name.startswith("splade-tiny__ar__")
    )
    assert alphas == [(2.0, "me5"), (4.0, "me5"), (4.0, "minilm")]
    # the MiniLM SPLADE beside it: trained on English XQuAD first, then transferred the same way
    both, files = _planned(replace(cfg, models=("splade-tiny", "minilm-splade")), tmp_path / "b")
    tiny_eval, source, minilm_eval = both.assets
    assert isinstance(source.cfg, FinetuneConfig)
    assert source.cfg.train == "xquad:en" and source.cfg.model == str(files["untrained"])
    assert _evaluate(minilm_eval).model == f"{source.output}/model"
    assert _evaluate(tiny_eval).model == "splade-tiny"
    assert len(both.cells) == 2 * 5 * 11


def test_the_cross_lingual_preset_runs_any_language_given_its_tokenizer_and_xquad_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A language outside the five: its tokenizer (target_tokenizers) and its XQuAD-format file
    (xquad_dir)."""
    from tests.conftest import error_lines

    xquad = tmp_path / "xquad"
    xquad.mkdir()
    (xquad / "xquad.de.json").write_text("{}")
    args = [
        "--preset",
        "xling",
        "--languages",
        "de",
        "--methods",
        "sembridge,random",
        "--output",
        str(tmp_path / "o"),
    ]
    assert reproduce.main([*args, "--dry-run"]) == 2
    assert "language 'de' has no bundled tokenizer" in error_lines(capsys)[0]
    args += ["target_tokenizers=de=/tok/de", f"xquad_dir={xquad}"]
    cfg, _ = parse_config(ReproduceConfig, args, flags=job_spec("reproduce").flags, job="reproduce")
    planned, _ = _planned(cfg, tmp_path / "o")
    assert sorted(planned.cells) == [
        "splade-tiny__de__random",
        "splade-tiny__de__sembridge__a4",
    ]
    stages = {s.name: s.cfg for s in planned.cells["splade-tiny__de__sembridge__a4"]}
    init, zero, tune = stages["init"], stages["xquad/zero_shot"], stages["xquad/finetune"]
    assert (
        isinstance(init, InitConfig)
        and isinstance(zero, EvaluateConfig)
        and isinstance(tune, FinetuneConfig)
    )
    assert init.target_tokenizer == "/tok/de" and zero.dataset == f"xquad:de@{xquad}"
    assert (tune.train, tune.eval_split) == (f"xquad:de@{xquad}", "dev")


def test_method_entries_take_their_own_bridge_and_alpha() -> None:
    cells = expand(
        ("m",), ("ko",), ("sembridge", "sembridge=2", "sembridge@minilm", "focus"), ("4", "1")
    )
    assert [c.name for c in cells] == [
        "m__ko__sembridge__a4",
        "m__ko__sembridge__a1",
        "m__ko__sembridge__a2",
        "m__ko__sembridge@minilm__a4",
        "m__ko__sembridge@minilm__a1",
        "m__ko__focus",
    ]
    from sembridge_ray.recipes.reproduce.compare import reference_cell

    reference = reference_cell(cells)
    assert reference is not None and reference.name == "m__ko__sembridge__a4"
    for bad, said in (
        ("fvt@minilm", "'@BRIDGE' needs a method"),
        ("focus=2", "'=ALPHA' needs a method with an α"),
    ):
        with pytest.raises(ConfigError, match=said):
            ReproduceConfig(methods=(bad,))


def test_seeds_repeat_fine_tuning_and_only_the_random_init_and_nothing_else(
    tmp_path: Path,
) -> None:
    """``seeds=2``: each seed fine-tunes with its own seed (pair order, dropout); a random init is
    drawn per seed; a deterministic init (sembridge) and its zero-shot evaluation serve both seeds.
    Between seeds, a stage's settings differ in its seed alone; ``seed_methods`` limits the seeds to
    its entries."""
    cfg = ReproduceConfig(
        assets="xling",
        models=("splade-tiny",),
        languages=("ru",),
        datasets=("xquad",),
        methods=("sembridge", "random", "fvt"),
        seeds=2,
        seed_methods=("sembridge", "random"),
        finetune=FinetuneConfig(optim=OptimConfig(max_steps=4)),
    )
    planned, _ = _planned(cfg, tmp_path)
    names = {cell: [s.name for s in stages] for cell, stages in planned.cells.items()}
    tuned = ["xquad/finetune", "xquad/finetuned", "xquad/finetuned+bm25"]
    zero = ["xquad/zero_shot", "xquad/zero_shot+bm25"]
    assert names["splade-tiny__ru__sembridge__a4"] == [
        "init",
        *zero,
        *tuned,
        *(f"seed-1/{n}" for n in tuned),
    ]
    assert names["splade-tiny__ru__random"] == [
        "init",
        *zero,
        *tuned,
        *(f"seed-1/{n}" for n in ("init", *zero, *tuned)),
    ]
    assert names["splade-tiny__ru__fvt"] == ["init", *zero, *tuned]  # not in seed_methods
    for cell in ("splade-tiny__ru__sembridge__a4", "splade-tiny__ru__random"):
        stages = {s.name: s for s in planned.cells[cell]}
        for name in ("init", "xquad/finetune") if cell.endswith("random") else ("xquad/finetune",):
            first, second = stages[name], stages[f"seed-1/{name}"]
            a, b = (s.cfg.identity(s.job, {}).settings for s in (first, second))
            assert {k for k in a if a[k] != b.get(k)} == {"seed"}, name
            assert first.output != second.output and first.identity != second.identity
        # the seed-1 fine-tuning starts from its own seed's init
        tune = stages["seed-1/xquad/finetune"]
        init = stages["seed-1/init" if cell.endswith("random") else "init"]
        assert tune.inputs["model"] == f"{init.ref}/model"
    one = _planned(replace(cfg, seeds=1), tmp_path / "one")[0]
    assert all(not s.name.startswith("seed-") for st in one.cells.values() for s in st)


def test_bm25_runs_once_per_language_and_every_evaluation_is_fused_with_it(tmp_path: Path) -> None:
    cfg = ReproduceConfig(
        assets="xling",
        models=("splade-tiny",),
        languages=("ru", "zh"),
        datasets=("xquad",),
        methods=("sembridge", "random"),
    )
    planned, _ = _planned(cfg, tmp_path)
    bm25 = {s.name: s for s in planned.baselines}
    assert sorted(bm25) == [
        "baselines/bm25/en/xquad/test",
        "baselines/bm25/ru/dev/dev",
        "baselines/bm25/ru/xquad/test",
        "baselines/bm25/zh/dev/dev",
        "baselines/bm25/zh/xquad/test",
    ]
    ru = bm25["baselines/bm25/ru/xquad/test"].cfg
    assert (ru.tokenizer, ru.dataset, ru.k1, ru.b) == ("tok-ru", "xquad:ru", 0.9, 0.4)  # type: ignore[attr-defined]
    dev = bm25["baselines/bm25/ru/dev/dev"].cfg
    assert dev.max_queries == cfg.finetune.eval_max_queries  # type: ignore[attr-defined]
    for cell, stages in planned.cells.items():
        lang = cell.split("__")[1]
        evaluations = {s.name: s for s in stages if s.job == "evaluate"}
        for fused in (s for s in stages if s.job == "fusion"):
            model_run = evaluations[fused.name.removesuffix("+bm25")]
            assert fused.inputs == {
                "model_run": model_run.ref,
                "bm25_run": bm25[f"baselines/bm25/{lang}/xquad/test"].ref,
            }
        assert len([s for s in stages if s.job == "fusion"]) == 2
    off = _planned(replace(cfg, bm25=replace(cfg.bm25, enabled=False)), tmp_path / "off")[0]
    assert off.baselines == [] and all(s.job != "fusion" for st in off.cells.values() for s in st)


def test_a_cross_lingual_grid_missing_an_input_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixtures_root: Path
) -> None:
    """Issue 42, 7: a language without its XQuAD-format file, or a target tokenizer that is not
    one, is one line and exit 2 from the dry run and the run alike, before any source is scored."""
    from tests.conftest import error_lines

    xquad, notatok = tmp_path / "xquad", tmp_path / "not-a-tokenizer"
    xquad.mkdir()
    notatok.mkdir()
    (notatok / "tokenizer.json").write_text("{}")
    base = ["--preset", "xling", "--methods", "sembridge", "--output", str(tmp_path / "o")]
    cases = [
        ([f"xquad_dir={xquad}", "--languages", "ru"], "language 'ru': "),
        (
            [f"target_tokenizers=ru={notatok}", "--languages", "ru"],
            f"cannot load tokenizer '{notatok}'",
        ),
    ]
    for extra, said in cases:
        for mode in (["--dry-run"], []):
            assert reproduce.main([*base, *extra, *mode]) == 2
            (line,) = error_lines(capsys)
            assert said in line, line
    assert not (tmp_path / "o" / "sources").exists()
