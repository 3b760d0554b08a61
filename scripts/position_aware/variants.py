"""Measure init variants on a miniature setting: init (through Ray) -> zero-shot eval [-> fine-tune
-> eval], then every variant against the reference variant, paired over queries (bootstrap CI,
sign-flip p), with the counterpart and support statistics of each init.

The assets come from a demo reproduction run (``python -m jobs.reproduce --preset demo --output
ROOT``): its ``config.yaml`` gives the init/evaluate/finetune settings and ``ROOT/assets`` the
source model and SICK data.

    PYTHONPATH=. python scripts/position_aware/variants.py --demo /tmp/position-demo --out /tmp/position-exp \\
        --variants faithful,marker,prior-0.1 [--finetune] [--target /path/to/tokenizer --setting NAME]

Variants are ``name=key:value;key:value`` InitConfig overrides, or one of the names in ``VARIANTS``;
the ablation of the neutral position class (``marker-symbols-classed``) is no config key but
``initialise``'s ``neutral_symbols`` (see ``embed_init.position.position_class``). """

from __future__ import annotations

import argparse
import json
import logging
import sys
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce.compare import paired_test, read_per_query
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.recipes.reproduce.stages import Assets
from sembridge_ray.runtime.config import coerce, read_config
from sembridge_ray.runtime.logs import setup_logging
from sembridge_ray.runtime.outputs import atomic_write_json, atomic_write_text

log = logging.getLogger("position_aware.variants")
ON = {"position_aware": True, "position_penalty": 0.0}
HASH, HYPHEN = {**ON, "position_marker": "##"}, {**ON, "position_marker": "-"}
# every marker spelled out, so that a rerun measures what docs/ reports
VARIANTS: dict[str, dict[str, Any]] = {
    "faithful": {},
    "improved": {"position_aware": True},  # the defaults: must equal marker-hyphen
    "marker": HASH,
    "marker-hyphen": HYPHEN,
    "marker-symbols-classed": HASH,  # with neutral_symbols=False: see SYMBOLS_CLASSED
    **{
        f"prior-{p:g}": {**ON, "position_marker": "", "position_penalty": p}
        for p in (0.05, 0.1, 0.2, 0.35, 0.5)
    },
    "mask": {**ON, "position_marker": "", "position_penalty": 4.0},
    **{f"marker+prior-{p:g}": {**HASH, "position_penalty": p} for p in (0.05, 0.1, 0.2)},
    "marker+mask": {**HASH, "position_penalty": 4.0},
    **{
        f"{name}{suffix}": {**base, **rule}
        for name, base in (
            ("alpha2", {"alpha": 2.0}),
            ("softmax", {"alpha": 1.0}),
            ("focus", {"method": "focus"}),
            ("wechsel", {"method": "wechsel"}),
        )
        for suffix, rule in (("", {}), ("+marker", HASH), ("+hyphen", HYPHEN))
    },
    "random": {"method": "random"},
    "mean": {"method": "mean"},
}


SYMBOLS_CLASSED = {"marker-symbols-classed"}
"""Variants run with ``neutral_symbols=False``: punctuation and symbols get a position class like
words do (the ablation of the neutral class; no config key, so these runs get their own outputs,
never a shared one)."""
STAGES = ("zero_shot", "finetuned")


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name`` (from VARIANTS) or ``name=key:value;key:value`` (InitConfig fields, coerced by their
    types)."""
    name, _, spec = text.partition("=")
    if not spec:
        return name, VARIANTS[name]
    hints = typing.get_type_hints(InitConfig)
    out: dict[str, Any] = {}
    for item in spec.split(";"):
        key, _, value = item.partition(":")
        out[key] = coerce(value, hints[key], key)
    return name, out


def demo_assets(cfg: ReproduceConfig) -> Assets:
    """The demo reproduction's inputs (already built: checked, not rebuilt), as its plan names
    them."""
    from sembridge_ray.recipes.reproduce.config import DEMO_LANGUAGE
    from sembridge_ray.recipes.reproduce.grid import (
        DEMO_DATASET,
        DEMO_MODEL,
        Identities,
        demo_files,
    )
    from sembridge_ray.recipes.reproduce.stages import MODEL, source_stages

    files = demo_files(cfg)
    source, _ = source_stages(
        cfg, files["untrained"], files["source_pairs"], files["beir"], Identities()
    )
    return Assets(
        models={DEMO_MODEL: f"{source.output}/{MODEL}"},
        tokenizers={DEMO_LANGUAGE: str(files["target"])},
        specs={(DEMO_DATASET, DEMO_LANGUAGE): (str(files["beir"]), str(files["sick_train"]))},
    )


def run_variant(
    cfg: ReproduceConfig,
    assets: Assets,
    out: Path,
    name: str,
    overrides: dict[str, Any],
    target: str,
    finetune: bool,
) -> dict[str, Any]:
    """One variant's init, zero-shot eval and (optionally) fine-tune + eval; returns its report and
    metrics."""
    from sembridge_ray.recipes.evaluate.run import run_evaluate
    from sembridge_ray.recipes.finetune.run import run_finetune
    from sembridge_ray.recipes.init.run import run_init

    root = out / name
    (model_name,), (eval_spec, train_spec) = assets.models, next(iter(assets.specs.values()))
    init = replace(
        cfg.init,
        source_model=assets.models[model_name],
        target_tokenizer=target,
        output=str(root / "init"),
        **overrides,
    )
    run_init(init, neutral_symbols=name not in SYMBOLS_CLASSED, executor=RayExecutor())
    evaluate = replace(
        cfg.evaluate, dataset=eval_spec, split=cfg.eval_split, cache_dir=str(out / "cache" / "eval")
    )
    metrics = {
        "zero_shot": run_evaluate(
            replace(evaluate, model=str(root / "init" / "model"), output=str(root / "zero_shot")),
            executor=RayExecutor(),
        )
    }
    if finetune:
        run_finetune(
            replace(
                cfg.finetune,
                model=str(root / "init" / "model"),
                train=train_spec,
                output=str(root / "finetune"),
            ),
            executor=RayExecutor(),
        )
        metrics["finetuned"] = run_evaluate(
            replace(evaluate, model=str(root / "finetune"), output=str(root / "finetuned")),
            executor=RayExecutor(),
        )
    rep = json.loads((root / "init" / "init_report.json").read_text(encoding="utf-8"))
    return {
        "variant": name,
        "overrides": overrides,
        "position": rep.get("position"),
        "support_histogram": rep.get("support_histogram"),
        **{stage: m.ndcg_at_10 for stage, m in metrics.items()},
    }


def compare_all(out: Path, rows: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    """Each variant minus the reference, per stage, paired over queries."""
    result = []
    for stage in STAGES:
        ref_file = out / reference / stage / "per_query.tsv"
        if not ref_file.is_file():
            continue
        ref = read_per_query(ref_file)
        qids = sorted(ref)
        for row in rows:
            path = out / row["variant"] / stage / "per_query.tsv"
            if row["variant"] == reference or not path.is_file():
                continue
            other = read_per_query(path)
            test = paired_test(np.array([other[q] for q in qids]), np.array([ref[q] for q in qids]))
            result.append(
                {"variant": row["variant"], "stage": stage, "reference": reference, **test}
            )
    return result


def markdown(rows: list[dict[str, Any]], paired: list[dict[str, Any]], setting: str) -> str:
    tests = {(p["variant"], p["stage"]): p for p in paired}
    lines = [
        f"## {setting}",
        "",
        "| variant | zero-shot | Δ [95% CI] p | fine-tuned | Δ [95% CI] p | "
        "zero weight on counterpart: word-initial / continuation | mean support: word-initial / continuation |",
        "|---|---:|---|---:|---|---|---|",
    ]
    for r in rows:
        cells = [r["variant"]]
        for stage in STAGES:
            cells.append(f"{r[stage]:.3f}" if stage in r else "")
            t = tests.get((r["variant"], stage))
            cells.append(
                f"{t['mean_diff']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] {t['p_value']:.3f}"
                if t
                else ""
            )
        pos = r.get("position") or {}
        cp, hist = pos.get("exact_counterpart", {}), pos.get("support_histogram", {})
        cells.append(" / ".join(_share(cp.get(c)) for c in ("word_initial", "continuation")))
        cells.append(
            " / ".join(_mean_support(hist.get(c)) for c in ("word_initial", "continuation"))
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _share(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("zero_weight_share") is None:
        return "-"
    return f"{entry['zero_weight_share']:.1%} ({entry['zero_weight']}/{entry['with_counterpart']})"


def _mean_support(hist: dict[str, int] | None) -> str:
    if not hist:
        return "-"
    n = sum(hist.values())
    return f"{sum(int(k) * v for k, v in hist.items()) / n:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--demo", type=Path, required=True, help="a demo reproduction's output root"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default="faithful,marker")
    parser.add_argument("--reference", default="faithful")
    parser.add_argument("--target", default="", help="target tokenizer (default: the demo's)")
    parser.add_argument("--setting", default="demo")
    parser.add_argument("--finetune", action="store_true")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    cfg = read_config(ReproduceConfig, args.demo / "config.yaml")
    assets = demo_assets(cfg)  # already built: every stage is skipped
    target = args.target or next(iter(assets.tokenizers.values()))
    done = args.out / "variants.json"
    # earlier invocations' variants
    rows = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else []
    for text in args.variants.split(","):
        name, overrides = parse_variant(text)
        row = run_variant(cfg, assets, args.out, name, overrides, target, args.finetune)
        rows = [r for r in rows if r["variant"] != name] + [row]
        atomic_write_json(done, rows)
    paired = compare_all(args.out, rows, args.reference)
    atomic_write_json(args.out / "comparisons.json", paired)
    atomic_write_text(args.out / "variants.md", markdown(rows, paired, args.setting))
    print((args.out / "variants.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
