"""A deterministic synthetic English-like corpus to train the tiny model's tokenizer on."""

import random

WORDS = (
    "the a an of to in on for with by from at as is are was were be been cache block layer "
    "token prefix request model engine worker scheduler memory host device copy load store "
    "lease evict hit miss transfer peer prefill decode trace span event failure retry policy "
    "time first second fast slow small large tiny open close read write send receive queue "
    "batch step forward attention key value head hidden vector matrix tensor number count "
    "operator dashboard backend timeline state table query index page shared long short "
    "river mountain city garden window music story letter market winter summer light dark "
    "quick brown fox jumps over lazy dog bright silver moon quiet ocean green forest stone "
    "paper pencil kitchen table coffee morning evening journey bridge tower castle dragon "
    "and or but not if then when while because although every each some many few none all"
).split()


def sentences(seed: int, count: int) -> list[str]:
    """count pseudo-random sentences; the same seed always gives the same list."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = rng.choices(WORDS, k=rng.randint(5, 18))
        sentence = " ".join(words).capitalize()
        if rng.random() < 0.3:
            sentence += f" {rng.randint(0, 9999)}"
        out.append(sentence + rng.choice(".!?"))
    return out
