"""The run's one oracle: greedy tokens without a connector per prompt set, max_tokens and TP,
computed once (one baseline engine per TP for every set the collected modules declared)."""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.harness.engine import ENGINE_ENV, llm_kwargs

Prompt = str | dict[str, Any]
"""A text prompt, or vLLM's {"prompt_token_ids": [...]}."""


@dataclass(frozen=True)
class PromptSet:
    """Prompts generated together in one call, greedily, max_tokens each, at a TP size."""

    prompts_json: str  # the prompts as JSON: hashable, and dict prompts compare by value
    max_tokens: int = 16
    tp_size: int = 1

    @property
    def prompts(self) -> list[Prompt]:
        return json.loads(self.prompts_json)


_declared: dict[PromptSet, None] = {}  # insertion-ordered: one baseline pass in a stable order


def prompt_set(prompts: Sequence[Prompt], max_tokens: int = 16, tp_size: int = 1) -> PromptSet:
    """A prompt set the oracle will compute; declared at import, so that the first module to
    ask computes every collected module's sets in the same baseline engine.

    Declare together only prompts the test runs together: vLLM's CPU kernels are not
    batch-invariant, and on a Xeon with AMX the same prompt's greedy tokens changed with the
    number of requests decoded beside it (tests/reliability/README.md)."""
    declared = PromptSet(json.dumps(list(prompts)), max_tokens, tp_size)
    _declared.setdefault(declared)
    return declared


class Oracle:
    """Greedy tokens of declared prompt sets from an engine without a connector, cached in
    memory and (when given one) in pytest's cache, keyed by everything that decides them."""

    def __init__(self, model: Path, cache: Any | None = None) -> None:
        self.model, self.cache = model, cache
        self._tokens: dict[PromptSet, list[list[int]]] = {}
        self._model_digest = _digest_files(model)

    def tokens(self, prompts: PromptSet) -> list[list[int]]:
        """The baseline's tokens for this set; computes it (with every declared set of its TP
        not known yet) in one engine started for that, before the caller starts its own."""
        if prompts not in self._tokens and not self._load(prompts):
            self._compute(prompts.tp_size, [prompts])
        return self._tokens[prompts]

    def _load(self, prompts: PromptSet) -> bool:
        cached = self.cache.get(self._key(prompts), None) if self.cache is not None else None
        if cached is not None:
            self._tokens[prompts] = cached
        return cached is not None

    def _compute(self, tp_size: int, asked: list[PromptSet]) -> None:
        from kvscope.harness.engine import in_process_llm
        from kvscope.harness.oracle import greedy_tokens
        from kvscope.verify.driver import environ

        wanted = [s for s in [*asked, *_declared] if s.tp_size == tp_size]
        missing = [s for s in dict.fromkeys(wanted) if s not in self._tokens and not self._load(s)]
        with (
            environ(**baseline_env(tp_size)),
            in_process_llm(self.model, tensor_parallel_size=tp_size) as llm,
        ):
            for prompts in missing:
                # Each set sees an empty prefix cache, as in an engine of its own.
                llm.reset_prefix_cache()
                tokens = greedy_tokens(llm, prompts.prompts, prompts.max_tokens)
                self._tokens[prompts] = tokens
                if self.cache is not None:
                    self.cache.set(self._key(prompts), tokens)

    def _key(self, prompts: PromptSet) -> str:
        import vllm

        identity = json.dumps(
            [
                self._model_digest,
                vllm.__version__,
                llm_kwargs(Path("model")),
                prompts.prompts_json,
                prompts.max_tokens,
                prompts.tp_size,
            ],
            sort_keys=True,
        )
        return "kvscope/oracle/" + hashlib.sha256(identity.encode()).hexdigest()[:32]


def baseline_env(tp_size: int) -> dict[str, str]:
    """An in-process engine core; at TP>1 one core per rank (vLLM refuses TP=2 on two cores
    otherwise) and vLLM's serialization of the callables collective_rpc sends."""
    env = {**ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if tp_size > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(rank) for rank in range(tp_size))
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    return env


def _digest_files(folder: Path) -> str:
    """The model's identity: its files' bytes (build_model writes them byte-identical)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
