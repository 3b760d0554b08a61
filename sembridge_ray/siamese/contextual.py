"""Static word vectors distilled from MiniLM: aggregated contextual vectors (Bommasani et al., ACL
2020, "Interpreting Pretrained Contextualized Representations via Reductions to Static Embeddings")
and the input word-piece embeddings.

A word's aggregated vector is the mean, over its first ``k`` occurrences in an unlabeled corpus
(corpus order), of the pooled hidden state of its word pieces at one layer. The corpus is SICK train
+ trial, every STS sentence and, where nltk finds WordNet, its glosses and examples; SICK test is
never read. A word seen in no context gets its decontextualised vector instead: the same layer and
pooling with the word alone as the input (Bommasani's "decontextualized" reduction), so that every
row lives in the same space.

Words are matched lower-cased (the model is uncased), after the job's own tokenisation.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sembridge_ray.runtime.progress import Progress
from sembridge_ray.siamese.data import tokenize

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)
POOLINGS = ("mean", "first")
MAX_WORDS = 64
"""Corpus sentences are cut to their first 64 tokens, so that every counted occurrence fits in the
model's input."""
Occurrences = dict[str, list[tuple[int, int]]]


def context_corpus(sick_dir: Path, sts_dir: Path, wordnet: object | None) -> list[str]:
    """SICK train + trial, then both sentences of every STS line of every year present (scored or
    not), then the WordNet glosses and examples when ``wordnet`` is given; deduplicated, first
    occurrence kept. Never SICK test."""
    from sembridge_ray.data.sick import read_sick_split
    from sembridge_ray.data.sts import read_sts_sentences, sts_files

    sick = [
        s
        for split in ("train", "trial")
        for p in read_sick_split(sick_dir, split)
        for s in (p.a, p.b)
    ]
    years = [y for y in range(2012, 2017) if (Path(sts_dir) / str(y)).is_dir()]
    sts = [s for f in sts_files(sts_dir, years) for s in read_sts_sentences(f)]
    glosses: list[str] = []
    if wordnet is not None:
        for synset in wordnet.all_synsets():  # type: ignore[attr-defined]
            glosses += [synset.definition(), *synset.examples()]
    return list(dict.fromkeys(s for s in (*sick, *sts, *glosses) if s.strip()))


def corpus_digest(corpus: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for sentence in corpus:
        digest.update(sentence.encode("utf-8") + b"\n")
    return digest.hexdigest()[:12]


def corpus_tokens(corpus: Sequence[str]) -> list[list[str]]:
    """Each sentence as lower-cased job tokens, cut to ``MAX_WORDS``."""
    return [[t.lower() for t in tokenize(s)[:MAX_WORDS]] for s in corpus]


def first_occurrences(tokens: Sequence[Sequence[str]], words: Iterable[str], k: int) -> Occurrences:
    """word -> its first ``k`` (sentence, position) occurrences in corpus order; words never seen
    are absent."""
    wanted = set(words)
    found: Occurrences = {}
    for s, sentence in enumerate(tokens):
        for pos, token in enumerate(sentence):
            if token in wanted and len(hits := found.setdefault(token, [])) < k:
                hits.append((s, pos))
    return {w: hits for w, hits in found.items() if hits}


def pool_pieces(hidden: torch.Tensor, pieces: Sequence[int], pooling: str) -> torch.Tensor:
    """hidden (L, T, D) -> (L, D): the word's pieces (indices into T) pooled by ``mean`` or
    ``first``."""
    if pooling == "first":
        return hidden[:, pieces[0]]
    return hidden[:, list(pieces)].mean(dim=1)


def aggregate_contexts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tokens: Sequence[Sequence[str]],
    occurrences: Occurrences,
    batch_size: int = 64,
) -> dict[str, dict[str, np.ndarray]]:
    """pooling -> word -> (L, D) float32: the mean over a word's occurrences of its pooled pieces at
    every hidden layer the model returns (L = embeddings + each layer). Sentences are encoded once,
    in length order."""
    import torch

    by_sentence: dict[int, list[tuple[str, int]]] = {}
    for word, hits in occurrences.items():
        for s, pos in hits:
            by_sentence.setdefault(s, []).append((word, pos))
    order = sorted(by_sentence, key=lambda s: len(tokens[s]))
    sums: dict[str, dict[str, torch.Tensor]] = {p: {} for p in POOLINGS}
    counts: dict[str, int] = {}
    progress = Progress(log, "contexts", len(order), "sentences")
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            enc = tokenizer([list(tokens[s]) for s in batch], is_split_into_words=True, padding=True, truncation=True,
                            max_length=512, return_tensors="pt")  # fmt: skip
            # (B, L, T, D)
            hidden = torch.stack(model(**enc, output_hidden_states=True).hidden_states, dim=1)
            for row, s in enumerate(batch):
                ids = enc.word_ids(row)
                for word, pos in by_sentence[s]:
                    pieces = [i for i, w in enumerate(ids) if w == pos]
                    if not pieces:  # punctuation the tokenizer drops, or cut by max_length
                        continue
                    counts[word] = counts.get(word, 0) + 1
                    for pooling in POOLINGS:
                        vec = pool_pieces(hidden[row], pieces, pooling)
                        sums[pooling][word] = sums[pooling].get(word, 0) + vec
            progress.add(len(batch))
    progress.finish()
    return {p: {w: (v / counts[w]).float().numpy() for w, v in sums[p].items()} for p in POOLINGS}


def decontextualised(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, words: Sequence[str]
) -> dict[str, dict[str, np.ndarray]]:
    """pooling -> word -> (L, D): each word alone (``[CLS] pieces [SEP]``); all-``[UNK]`` words are
    left out."""
    corpus = [[w] for w in words]
    occ = {w: [(i, 0)] for i, w in enumerate(words) if in_vocabulary(tokenizer, w)}
    return aggregate_contexts(model, tokenizer, corpus, occ)


def in_vocabulary(tokenizer: PreTrainedTokenizerBase, word: str) -> bool:
    """Whether ``word`` has word pieces that are not all ``[UNK]``."""
    pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
    return bool(pieces) and any(p != tokenizer.unk_token_id for p in pieces)


def input_embeddings(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, words: Sequence[str]
) -> dict[str, np.ndarray]:
    """word -> (D,): the mean of its word pieces' input embeddings (no position or type embedding,
    no layer)."""
    table = model.get_input_embeddings().get_parameter("weight").detach()
    out = {}
    for word in dict.fromkeys(words):
        text = word.replace("_", " ")
        if in_vocabulary(tokenizer, text):
            pieces = tokenizer(text, add_special_tokens=False)["input_ids"]
            out[word] = table[pieces].mean(dim=0).float().numpy()
    return out
