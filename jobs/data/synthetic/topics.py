"""Generated labelled sentences for text classification (`data.source: builtin:topics`).

AG-News-shaped and offline: 4 topics (world, sports, business, sci/tech). A sentence is
3-12 common English words with 2-3 words from its topic's vocabulary and, in a third of
the sentences, one distractor word from another topic, so the label is the topic that
has the most words. Lengths vary, so padding and the pad mask matter. Pure Python.
"""

from __future__ import annotations

import random

TOPICS = {
    "world": "election minister treaty embassy border refugees parliament summit ceasefire "
    "diplomat president protest",
    "sports": "football striker goal tournament coach league championship match olympic "
    "tennis referee season",
    "business": "shares profit market investors merger revenue bank inflation earnings "
    "company stocks quarter",
    "scitech": "software computer internet scientists space chip research satellite "
    "robot network browser physics",
}
FILLER = (
    "the a of to and in on for with at by from after before over about this that it "
    "was is were said new week year today people two three report officials said "
    "during while under still more most first last next group city country plans "
    "announced according local early late major several"
).split()
LABELS = list(TOPICS)


def make_topics(n: int, seed: int) -> dict[str, list]:
    """{'text': [n sentences], 'label': [n ints in 0..3]}, a pure function of (n, seed)."""
    rng = random.Random(seed)
    vocab = [words.split() for words in TOPICS.values()]
    texts, labels = [], []
    for _ in range(n):
        label = rng.randrange(len(vocab))
        words = rng.choices(FILLER, k=rng.randint(3, 12))
        topical = rng.choices(vocab[label], k=rng.randint(2, 3))
        if rng.random() < 1 / 3:
            other = rng.choice([v for i, v in enumerate(vocab) if i != label])
            topical.append(rng.choice(other))
        for word in topical:
            words.insert(rng.randint(0, len(words)), word)
        texts.append(" ".join(words))
        labels.append(label)
    return {"text": texts, "label": labels}
