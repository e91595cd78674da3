"""A generated task whose true token importance is known.

Single sentences ("synthetic"): a handful of neutral distractor words and one polarity cue word;
a negation word right before the cue flips it. The label is the polarity after negation, so only
the cue and its negation matter: they are the importance mask (1), everything else is 0. One cue
per sentence keeps the ground truth sharp: masking the cue must change the label.

Sentence pairs ("synthetic-pair"): each side holds one colour word among distractors; the label is
whether both colours are the same. The two colour words are the importance mask.

Harder variants (the SSA mechanism benchmark, params/mechanism.yaml), both off by default so the
default data stays byte-identical:
- `spurious` = s > 0 adds a shortcut: the word SPURIOUS is inserted into text a (importance 0). In
  train, with probability s it is present exactly when the label is 1, otherwise present by a fair
  coin: its phi correlation with the label is s. In dev it is present by a fair coin (phi 0), so a
  model that learned the shortcut instead of the cue loses accuracy on dev.
- `distractors` = N > 0 draws N-3 .. N+3 (at least 1) distractor words per sentence (per side of a
  pair) instead of 5-11 (4-9 per side), so a cue is rarer among the tokens a model sees.

Every word is a whole word in an uncased BERT vocabulary, so word-pieces line up with words.
"""
from __future__ import annotations

import numpy as np

from kit.config.tasks import Split

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
SPURIOUS = "zebra"   # the shortcut word of the spurious variant: in no other list
DATA_SEED = 1234  # the data is fixed; run seeds vary only the training


def _distractors(rng: np.random.Generator, low: int = 5, high: int = 11,
                 count: int = 0) -> list[str]:
    """Between low and high distractor words; `count` > 0 overrides the range: count-3 .. count+3
    (at least 1)."""
    if count > 0:
        low, high = max(1, count - 3), count + 3
    return list(rng.choice(DISTRACTORS, size=rng.integers(low, high + 1)))


def _polarity_sentence(rng: np.random.Generator, count: int = 0
                       ) -> tuple[list[str], list[int], int]:
    words = _distractors(rng, count=count)
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


def _colour_pair(rng: np.random.Generator, count: int = 0
                 ) -> tuple[list[str], list[str], list[int], int]:
    label = int(rng.integers(2))            # 1 = same colour
    first = rng.choice(COLOURS)
    second = first if label else rng.choice([c for c in COLOURS if c != first])
    sides, importance = [], []
    for colour in (first, second):
        words = _distractors(rng, 4, 9, count)
        at = int(rng.integers(len(words) + 1))
        words.insert(at, colour)
        sides.append(words)
        importance += [int(i == at) for i in range(len(words))]
    return sides[0], sides[1], importance, label


def spurious_present(rng: np.random.Generator, label: int, correlation: float) -> bool:
    """Whether a row carries the shortcut word: with probability `correlation` exactly when
    label is 1, else by a fair coin (so its phi correlation with a balanced label is
    `correlation`; 0 = independent of the label)."""
    if rng.random() < correlation:
        return bool(label)
    return bool(rng.random() < 0.5)


def _add_spurious(rng: np.random.Generator, words: list[str], importance: list[int],
                  label: int, correlation: float) -> None:
    """Insert SPURIOUS into `words` (text a) at a random place when spurious_present says so;
    its importance is 0 (it does not decide the label). In place."""
    if spurious_present(rng, label, correlation):
        at = int(rng.integers(len(words) + 1))
        words.insert(at, SPURIOUS)
        importance.insert(at, 0)


def generate(pair: bool, n: int, split: str, spurious: float = 0.0,
             distractors: int = 0) -> Split:
    """`n` examples of the single-sentence or pair task; deterministic per (pair, split, spurious,
    distractors). `spurious` (train split only; dev/test get an independent coin when > 0) and
    `distractors` make the task harder: see the module docstring. 0 / 0 is the original task."""
    offset = {"train": 0, "dev": 1, "test": 2}[split]
    rng = np.random.default_rng([DATA_SEED, int(pair), offset])
    correlation = spurious if split == "train" else 0.0
    text_a, text_b, importance, labels = [], [] if pair else None, [], []
    for _ in range(n):
        if pair:
            a, b, imp, label = _colour_pair(rng, distractors)
            text_b.append(" ".join(b))
        else:
            a, imp, label = _polarity_sentence(rng, distractors)
        if spurious > 0:
            _add_spurious(rng, a, imp, label, correlation)
        text_a.append(" ".join(a))
        importance.append(imp)
        labels.append(label)
    name = "synthetic-pair" if pair else "synthetic"
    return Split(text_a=text_a, text_b=text_b, labels=np.array(labels, dtype=np.int64),
                 ids=[str(i) for i in range(n)], source=f"{name}:{split}", importance=importance)
