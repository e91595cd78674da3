"""A generated task whose true token importance is known.

Single sentences ("synthetic"): a handful of neutral distractor words and one polarity cue word;
a negation word right before the cue flips it. The label is the polarity after negation, so only
the cue and its negation matter: they are the importance mask (1), everything else is 0. One cue
per sentence keeps the ground truth sharp: masking the cue must change the label.

Sentence pairs ("synthetic-pair"): each side holds one colour word among distractors; the label is
whether both colours are the same. The two colour words are the importance mask.

Every word is a whole word in an uncased BERT vocabulary, so word-pieces line up with words.
"""
from __future__ import annotations

import numpy as np

from kit.tasks import Split

POSITIVE = ("good", "great", "excellent", "wonderful", "brilliant", "superb", "lovely", "fine")
NEGATIVE = ("bad", "awful", "terrible", "poor", "horrible", "dreadful", "boring", "weak")
NEGATIONS = ("not", "never")
COLOURS = ("red", "blue", "green", "yellow", "black", "white", "brown", "purple")
DISTRACTORS = (
    "the", "a", "movie", "film", "plot", "actor", "story", "scene", "music", "director", "was",
    "is", "this", "that", "with", "and", "of", "in", "on", "for", "quite", "very", "really",
    "some", "its", "every", "script", "camera", "city", "night", "house", "road", "table",
    "yesterday", "today", "again", "after", "before", "people", "friend", "window", "river",
)
DATA_SEED = 1234  # the data is fixed; run seeds vary only the training


def _distractors(rng: np.random.Generator, low: int = 5, high: int = 11) -> list[str]:
    return list(rng.choice(DISTRACTORS, size=rng.integers(low, high + 1)))


def _polarity_sentence(rng: np.random.Generator) -> tuple[list[str], list[int], int]:
    words = _distractors(rng)
    important = [0] * len(words)
    label = int(rng.integers(2))            # 1 = positive
    negate = rng.random() < 0.3
    surface = label ^ negate                # a negated cue carries the opposite polarity
    cue = [rng.choice(POSITIVE if surface else NEGATIVE)]
    if negate:
        cue = [rng.choice(NEGATIONS)] + cue
    at = int(rng.integers(len(words) + 1))
    words[at:at] = cue
    important[at:at] = [1] * len(cue)
    return words, important, label


def _colour_pair(rng: np.random.Generator) -> tuple[list[str], list[str], list[int], int]:
    label = int(rng.integers(2))            # 1 = same colour
    first = rng.choice(COLOURS)
    second = first if label else rng.choice([c for c in COLOURS if c != first])
    sides, importance = [], []
    for colour in (first, second):
        words = _distractors(rng, 4, 9)
        at = int(rng.integers(len(words) + 1))
        words.insert(at, colour)
        sides.append(words)
        importance += [int(i == at) for i in range(len(words))]
    return sides[0], sides[1], importance, label


def generate(pair: bool, n: int, split: str) -> Split:
    """`n` examples of the single-sentence or pair task; deterministic per (pair, split)."""
    offset = {"train": 0, "dev": 1, "test": 2}[split]
    rng = np.random.default_rng([DATA_SEED, int(pair), offset])
    text_a, text_b, importance, labels = [], [] if pair else None, [], []
    for _ in range(n):
        if pair:
            a, b, imp, label = _colour_pair(rng)
            text_b.append(" ".join(b))
        else:
            a, imp, label = _polarity_sentence(rng)
        text_a.append(" ".join(a))
        importance.append(imp)
        labels.append(label)
    name = "synthetic-pair" if pair else "synthetic"
    return Split(text_a=text_a, text_b=text_b, labels=np.array(labels, dtype=np.int64),
                 ids=[str(i) for i in range(n)], source=f"{name}:{split}", importance=importance)
