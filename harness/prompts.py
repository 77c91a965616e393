"""Prompts for engine tests, benchmarks and the demo: several blocks long."""

SENTENCES = [
    "The quick brown fox jumps over the lazy dog while the cache keeps every block warm.",
    "A prefill engine computes the prompt and a decode engine pulls its blocks over NIXL.",
    "Operators watch leases, transfers and failures on a live dashboard in the browser.",
    "Every hook of the connector becomes a span, exported over OTLP to the backend.",
    "Silver moon over a quiet ocean, green forest and stone bridge near the old castle.",
]


def long_prompt(i: int, sentences: int = 4) -> str:
    """About 20 tokens a sentence with the tiny model's tokenizer: 4 sentences > 2 blocks."""
    return " ".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(sentences))


DISTINCT = [long_prompt(i) for i in range(3)]
"""Prompts with different first blocks."""
