"""SemBridge+'s selection and ablation on the offline settings, in one process (no Ray): init ->
zero-shot nDCG@10 on a split, every variant paired with a reference over the same queries (bootstrap
CI, sign-flip p).

Scores are the evaluate job's (``retrieval.dev.score_queries``: the same encoding, exact search, TREC run
and ir-measures), so a variant here scores what ``jobs.evaluate`` gives its model on that split.

    # choose on the development split (SICK trial), the three public settings only
    PYTHONPATH=. python scripts/sembridge_plus/ablate.py --assets ROOT/assets --split dev --out /tmp/plus-dev \\
        --tokenizers DIR --settings en-bpe,en-roberta,en-kobigbird --variants faithful,pa,center,abtt3,fvt50,...
    # report the frozen recipe on SICK test, public and held-out settings
    PYTHONPATH=. python scripts/sembridge_plus/ablate.py --assets ROOT/assets --split test --out /tmp/plus-test \\
        --tokenizers DIR --settings en-bpe,en-roberta,en-kobigbird,en-unigram,en-spbpe --variants sembridge_plus,...

``ROOT`` is a demo reproduction's output (``jobs.reproduce --preset settings``): its source model
and SICK sets. ``DIR`` holds the real roberta-base/ and kobigbird-bert-base/ tokenizer folders (not
shipped with the package). Variants are names in ``VARIANTS`` or ``name=key:value;key:value``
InitConfig overrides. """

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
from sembridge_ray.recipes.reproduce.compare import paired_test
from sembridge_ray.runtime.config import coerce, read_config
from sembridge_ray.runtime.logs import setup_logging
from sembridge_ray.runtime.outputs import atomic_write_json, atomic_write_text

log = logging.getLogger("sembridge_plus.ablate")
PA = {"position_aware": True}
VARIANTS: dict[str, dict[str, Any]] = {
    "faithful": {},
    "pa": PA,
    "center": {"bridge_space": "center"},
    **{f"abtt{k}": {"bridge_space": "abtt", "bridge_components": k} for k in (1, 3, 10)},
    "whiten": {"bridge_space": "whiten"},
    "relative": {"bridge_space": "relative"},
    "lsq01": {"lsq_ridge": 0.1},
    "lsq1": {"lsq_ridge": 1.0},
    **{f"fvt{int(w * 100)}": {"fvt_weight": w} for w in (0.25, 0.5, 0.75)},
    "a2": {"alpha": 2.0},
    "softmax": {"alpha": 1.0},
    **{f"rb{int(w * 100)}": {"random_blend": w} for w in (0.1, 0.25, 0.35, 0.5, 0.65, 0.8)},
    "asfvt": {"adaptive_support": "fvt"},
    **{f"asfix{k}": {"adaptive_support": "fixed", "support_size": k} for k in (2, 4)},
    "freq": {"bias": "frequency", "bias_text": "{assets}/sick-train-pairs.parquet"},
    "sembridge_plus": {"method": "sembridge_plus"},
    "wechsel": {"method": "wechsel"},
    "focus": {"method": "focus"},
    "fvt": {"method": "fvt"},
    "mean": {"method": "mean"},
    "random": {"method": "random"},
}
SETTINGS = {
    "en-bpe": "{assets}/target-bpe",
    "en-roberta": "{tokenizers}/roberta-base",
    "en-kobigbird": "{tokenizers}/kobigbird-bert-base",
    "en-unigram": "{heldout}/en-unigram",
    "en-spbpe": "{heldout}/en-spbpe",
}
SPLITS = {"dev": ("sick-dev-beir", "dev"), "test": ("sick-beir", "test")}


FINETUNE = "finetune."
"""Prefix of a variant key that overrides the fine-tuning config
(``finetune.optim.embedding_warmup_steps:5``)."""


def parse_variant(text: str) -> tuple[str, dict[str, Any], list[str]]:
    """``a+b`` combines named variants; ``name=key:value;key:value`` gives InitConfig overrides, and
    ``finetune.``-prefixed keys fine-tuning overrides (``key=value`` strings for
    ``with_overrides``)."""
    name, _, spec = text.partition("=")
    if not spec:
        out: dict[str, Any] = {}
        for part in name.split("+"):
            out |= VARIANTS[part]
        return name, out, []
    hints = typing.get_type_hints(InitConfig)
    overrides, tuning = {}, []
    for item in spec.split(";"):
        key, _, value = item.partition(":")
        if key.startswith(FINETUNE):
            tuning.append(f"{key.removeprefix(FINETUNE)}={value}")
        else:
            overrides[key] = coerce(value, hints[key], key)
    return name, overrides, tuning


def score_model(model_dir: str, dev: Any, out: Path) -> dict[str, Any]:
    """The evaluate job's figures of a saved model on ``dev``; per-query nDCG@10 into
    ``out/per_query.tsv``."""
    from sentence_transformers import SparseEncoder

    from sembridge_ray.retrieval.dev import encode_share, score_queries

    model = SparseEncoder(model_dir, device="cpu")
    figures, per_query = score_queries(dev, encode_share(model, dev, (64, 256), "fp32", 0, 1))
    nd = per_query["nDCG@10"]
    atomic_write_text(
        out / "per_query.tsv", "".join(f"{q}\t{v!r}\n" for q, v in sorted(nd.items()))
    )
    return figures


def run_variant(
    base: InitConfig,
    dev: Any,
    out: Path,
    target: str,
    overrides: dict[str, Any],
    finetune: Any | None,
) -> dict[str, Any]:
    """Init, zero-shot score; with ``finetune`` (a FinetuneConfig) also fine-tune (Ray Train) and
    score again."""
    from sembridge_ray.recipes.init.run import initialise

    assets = Path(base.source_model).parent.parent  # ASSETS/minilm-splade/model
    overrides = {
        k: v.format(assets=assets) if isinstance(v, str) else v for k, v in overrides.items()
    }
    cfg = replace(base, target_tokenizer=target, output=str(out / "init"), **overrides)
    result = initialise(cfg)
    hist = result.support_histogram
    n = sum(hist.values())
    row = {
        **score_model(result.model, dev, out),
        "mean_support": sum(int(k) * v for k, v in hist.items()) / n if n else None,
        "init_s": round(sum(result.timings.values()), 1),
    }
    if finetune is None:
        return row
    from sembridge_ray.recipes.finetune.run import run_finetune

    tuned = replace(finetune, model=result.model, output=str(out / "finetune"))
    run_finetune(tuned, executor=RayExecutor())
    summary = json.loads((out / "finetune" / "finetune.json").read_text(encoding="utf-8"))
    figures = score_model(str(out / "finetune" / "model"), dev, out / "finetuned")
    return {**row, "finetuned": figures, "convergence": summary.get("convergence")}


def read_scores(path: Path) -> dict[str, float]:
    return {
        q: float(v)
        for q, v in (line.split("\t") for line in path.read_text(encoding="utf-8").splitlines())
    }


def table(
    out: Path, settings: list[str], variants: list[str], reference: str, stage: str = ""
) -> str:
    lines = [
        f"| variant | {' | '.join(settings)} | mean |",
        "|---|" + "---|" * (len(settings) + 1),
    ]
    for name in variants:
        cells, means = [name], []
        for setting in settings:
            path = out / setting / name / stage / "per_query.tsv"
            ref_path = out / setting / reference / stage / "per_query.tsv"
            if not path.is_file():
                cells.append("")
                continue
            scores = read_scores(path)
            qids = sorted(scores)
            mean = float(np.mean([scores[q] for q in qids]))
            means.append(mean)
            text = f"{mean:.3f}"
            if name != reference and ref_path.is_file():
                ref = read_scores(ref_path)
                t = paired_test(
                    np.array([scores[q] for q in qids]), np.array([ref[q] for q in qids])
                )
                text += f" ({t['mean_diff']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] p={t['p_value']:.3f})"
            cells.append(text)
        cells.append(f"{np.mean(means):.3f}" if len(means) == len(settings) else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--assets", type=Path, required=True, help="a demo reproduction's assets directory"
    )
    parser.add_argument(
        "--heldout", type=Path, default=Path("/tmp/heldout"), help="heldout_tokenizers.py's --out"
    )
    parser.add_argument(
        "--tokenizers",
        type=Path,
        help="a folder holding the real roberta-base/ and kobigbird-bert-base/ tokenizer folders (en-roberta and "
        "en-kobigbird; the package does not ship them)",
    )
    parser.add_argument("--split", choices=sorted(SPLITS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--settings", default="en-bpe,en-roberta,en-kobigbird")
    parser.add_argument("--variants", default="faithful,pa")
    parser.add_argument("--reference", default="faithful")
    parser.add_argument(
        "--finetune",
        action="store_true",
        help="also fine-tune (the settings preset's recipe) and score again",
    )
    args = parser.parse_args(argv)
    needs = [s for s in args.settings.split(",") if "{tokenizers}" in SETTINGS.get(s, "")]
    if needs and args.tokenizers is None:
        parser.error(
            f"--settings {needs[0]} needs --tokenizers DIR (holding roberta-base/ and kobigbird-bert-base/)"
        )
    setup_logging("WARNING")
    from sembridge_ray.retrieval.dev import load_judged

    name, split = SPLITS[args.split]
    dev = load_judged(str(args.assets / name), split)
    root = args.assets.parent
    base = replace(
        read_config(
            InitConfig,
            root
            / "cells"
            / next(iter(sorted((root / "cells").iterdir()))).name
            / "init"
            / "config.yaml",
        ),
        source_model=str(args.assets / "minilm-splade" / "model"),
        method="sembridge",
        position_aware=False,
        overwrite=False,
    )
    finetune = None
    if args.finetune:
        from sembridge_ray.cli import parse_config
        from sembridge_ray.recipes.reproduce.config import ReproduceConfig

        preset, _ = parse_config(ReproduceConfig, ["--preset", "settings"], job="reproduce")
        finetune = replace(
            preset.finetune,
            train=str(args.assets / "sick-train-pairs.parquet"),
            eval=str(args.assets / "sick-dev-beir"),
            eval_split="dev",
        )
    settings, variants = args.settings.split(","), []
    done = args.out / "variants.json"
    rows = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else []
    for setting in settings:
        target = SETTINGS[setting].format(
            assets=args.assets, heldout=args.heldout, tokenizers=args.tokenizers
        )
        for text in args.variants.split(","):
            vname, overrides, tuning = parse_variant(text)
            variants.append(vname) if vname not in variants else None
            if any(r["setting"] == setting and r["variant"] == vname for r in rows):
                continue
            tuned = finetune.with_overrides(tuning) if finetune is not None and tuning else finetune
            figures = run_variant(base, dev, args.out / setting / vname, target, overrides, tuned)
            rows.append(
                {
                    "setting": setting,
                    "variant": vname,
                    "overrides": overrides,
                    "finetune_overrides": tuning,
                    **figures,
                }
            )
            print(f"{setting} {vname}: nDCG@10 {figures['dev_nDCG@10']:.4f}", flush=True)
            atomic_write_json(done, rows)
    text = table(args.out, settings, variants, args.reference)
    if args.finetune:
        text += "\n## fine-tuned\n\n" + table(
            args.out, settings, variants, args.reference, "finetuned"
        )
    atomic_write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
