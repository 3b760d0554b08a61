from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.siamese import augment as aug
from sembridge_ray.siamese.data import TokenPair

THESAURUS = {
    "man": ["guy", "valet"],
    "playing": ["play"],
    "guitar": ["axe"],
    "dog": ["hound"],
    "runs": ["sprints"],
}
COSINE = {
    ("man", "guy"): 0.9,
    ("man", "valet"): 0.2,
    ("playing", "play"): 0.8,
    ("guitar", "axe"): 0.7,
    ("dog", "hound"): 0.95,
    ("runs", "sprints"): 0.5,
}


def similarity(word: str, candidate: str) -> float:
    return COSINE[(word.lower(), candidate)]


def pair(pid: str, a: str, b: str, score: float = 4.0) -> TokenPair:
    return TokenPair(pair_id=pid, a=tuple(a.split()), b=tuple(b.split()), score=score)


def run(
    pairs: list[TokenPair], gate: float = 0.6, passes: int = 10, seed: int = 0
) -> list[TokenPair]:
    draws = aug.draw_substitutions(
        pairs, THESAURUS, similarity, passes, np.random.default_rng(seed)
    )
    return aug.apply_gate(pairs, draws, gate)


def test_substitutions_follow_the_gate_and_keep_the_score() -> None:
    new = run([pair("1", "A man is playing a guitar", "The man is playing", 4.2)])
    assert new, "cosines 0.9/0.8/0.7 clear 0.6, so copies must appear"
    words = {w for p in new for w in (*p.a, *p.b)}
    assert "valet" not in words  # cosine 0.2 < 0.6: never accepted
    assert {"guy", "play", "axe"} & words
    assert all(p.score == 4.2 and p.pair_id.startswith("1~aug") for p in new)
    assert all(p.a[0] == "A" and p.a[2] == "is" for p in new)  # stopwords are never replaced


def test_a_pair_is_kept_only_when_both_sentences_change() -> None:
    # "runs" -> "sprints" has cosine 0.5, so sentence b can never change at gate 0.6
    assert run([pair("1", "A man is playing", "It runs")]) == []
    assert run([pair("2", "A man is playing", "It runs")], gate=0.5)


def test_duplicates_and_pairs_already_present_are_dropped() -> None:
    original = pair("1", "A dog", "The dog")
    present = pair("2", "A hound", "The hound")  # what the only possible substitution would produce
    assert run([original, present]) == []
    new = run([pair("3", "A dog", "The dog")], passes=10)
    assert len(new) == 1  # every pass makes the same pair; the later ones are duplicates


def test_augmentation_is_seeded() -> None:
    pairs = [pair(str(i), "A man is playing a guitar", "A man is playing") for i in range(20)]
    assert run(pairs, seed=3) == run(pairs, seed=3)
    assert run(pairs, seed=3) != run(pairs, seed=4)


def test_gates_compare_on_the_same_draws_and_choose_gate_meets_the_target() -> None:
    pairs = [pair(str(i), "A man is playing a guitar", "A man is playing") for i in range(30)]
    draws = aug.draw_substitutions(pairs, THESAURUS, similarity, 10, np.random.default_rng(0))
    loose, strict = aug.apply_gate(pairs, draws, 0.6), aug.apply_gate(pairs, draws, 0.85)
    assert len(strict) < len(loose)
    # cosines 0.8, 0.7 < 0.85
    assert {w for p in strict for w in (*p.a, *p.b)} & {"play", "axe"} == set()
    gate = aug.choose_gate(pairs, draws, 0.6, target=len(strict))
    assert gate > 0.6 and len(aug.apply_gate(pairs, draws, gate)) <= len(strict)
    assert aug.choose_gate(pairs, draws, 0.6, target=10**6) == 0.6


class _Synset:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class _WordNet:
    def synsets(self, word: str) -> list[_Synset]:
        return {
            "riding": [
                _Synset("riding.n.01"),
                _Synset("riding.n.02"),
                _Synset("ride.v.01"),
                _Synset("ride.v.02"),
                _Synset("drive.v.07"),
            ]
        }.get(word, [])


def test_wordnet_candidates_are_deduplicated_head_lemmas_minus_the_word() -> None:
    assert aug.wordnet_candidates("Riding", _WordNet()) == ["ride", "drive"]
    assert aug.build_thesaurus(["Riding", "riding", "xyzzy"], _WordNet()) == {
        "riding": ["ride", "drive"]
    }


def test_bundled_thesaurus_carries_the_wordnet_licence_and_reads_back() -> None:
    text = aug.bundled_thesaurus().read_text(encoding="utf-8")
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in text
    thesaurus = aug.read_thesaurus(aug.bundled_thesaurus())
    assert len(thesaurus) > 1500 and "play" in thesaurus["playing"]
    assert (aug.bundled_thesaurus().parent / "WORDNET_LICENSE.txt").is_file()


@pytest.mark.slow  # loading WordNet takes 8-20 s; the fake-WordNet test above is its fast twin
def test_bundled_thesaurus_is_what_wordnet_gives(shared_data: Path) -> None:
    wordnet = aug.load_wordnet(str(shared_data / "wordnet" / "nltk_data"))
    if wordnet is None:
        pytest.skip("WordNet not readable")
    bundled = aug.read_thesaurus(aug.bundled_thesaurus())
    sample = sorted(bundled)[::10]
    assert {w: aug.wordnet_candidates(w, wordnet) for w in sample} == {
        w: bundled[w] for w in sample
    }
