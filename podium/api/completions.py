"""The (legacy) Completions adapter: raw prompts in, text_completion objects or chunks out.

No conversation and no dialect: the prompt is the caller's own text or token ids, and each
choice's stream is the text pipeline alone (no output parsers). A text prompt is in the
model's own format, so special-token markup in it (``<|im_start|>``) is parsed as those
tokens; the chat APIs, which render client text into a template, read it as text."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator

from podium.api.common import sampling_params, stop_strings
from podium.api.structured import structured_grammar
from podium.engine.base import Engine, EngineRequest
from podium.errors import InvalidRequestError
from podium.generation import (Choice, choice_seed, drive, fold, new_id, off_loop,
                               output_budget, start)
from podium.protocol.completions import CompletionRequest
from podium.protocol.structured import StructuredOutputs
from podium.render.completions import CompletionChunks, CompletionFold, Echo
from podium.settings import Settings
from podium.text.pipeline import TextPipeline, TextStream


@dataclass
class Prompt:
    text: str            # what ``echo`` repeats
    token_ids: list[int]


class CompletionService:
    def __init__(self, engine: Engine, settings: Settings):
        self._engine = engine
        self._settings = settings

    async def create(self, req: CompletionRequest, *, small: bool = False
                     ) -> dict[str, Any] | AsyncGenerator[Any, None]:
        engine = self._engine
        _refuse_unsupported(req)
        prompts = await off_loop(self._prompts, req.prompt, inline=small)
        grammar = None
        if req.structured_outputs is not None:      # compiled for the vocabulary: off the loop
            grammar = await off_loop(self._grammar, req.structured_outputs, inline=False)
        choices: list[Choice] = []
        echoes: list[Echo | None] = []
        for p in prompts:
            budget = output_budget(len(p.token_ids), req.max_tokens, engine.info.context_length,
                                   self._settings.max_tokens_cap)
            for i in range(req.n):
                choices.append(self._choice(req, p, budget, i, grammar))
                echoes.append(p if req.echo else None)
        start(engine, choices)
        head = (new_id("cmpl"), int(time.time()), req.model, engine.tokenizer, req.logprobs,
                echoes)
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            return drive(engine, choices, CompletionChunks(*head, include_usage=bool(usage)),
                         n=req.n, keepalive=self._settings.stream_keepalive_seconds)
        return await fold(engine, choices, CompletionFold(*head), n=req.n)

    def _prompts(self, raw: Any) -> list[Prompt]:
        tok = self._engine.tokenizer
        if isinstance(raw, str):
            raw = [raw]
        elif raw and isinstance(raw[0], int):
            raw = [raw]
        prompts = []
        for i, item in enumerate(raw):
            if isinstance(item, str):
                prompts.append(Prompt(item, tok.encode(item, add_special=True)))
                continue
            bad = next((t for t in item if t >= tok.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"Token id {bad} is outside the vocabulary (0..{tok.vocab_size - 1})",
                    param=f"prompt[{i}]")
            prompts.append(Prompt(tok.decode(item), list(item)))
        for i, p in enumerate(prompts):
            if not p.token_ids:
                raise InvalidRequestError("The prompt is empty", param=f"prompt[{i}]")
        return prompts

    def _grammar(self, so: StructuredOutputs) -> str:
        """vLLM's ``structured_outputs``: the raw prompt's own constraint (no dialect)."""
        grammar = structured_grammar(so, self._engine.tokenizer.grammar_specials)
        self._engine.check_grammar(grammar)
        return grammar

    def _choice(self, req: CompletionRequest, prompt: Prompt, budget: int, index: int,
                grammar: str | None) -> Choice:
        tok = self._engine.tokenizer
        seed = choice_seed(req.seed, self._settings.seed, index)
        want = req.logprobs is not None
        sampling = replace(sampling_params(req, budget, tok.vocab_size, seed), grammar=grammar)
        request = EngineRequest(new_id("req"), prompt.token_ids, sampling,
                                logprobs=req.logprobs,
                                prompt_logprobs=req.logprobs if want and req.echo else None)
        return Choice(request, TextStream(TextPipeline(tok, stop_strings(req.stop), want),
                                          prompt_tokens=len(prompt.token_ids)))


def _refuse_unsupported(req: CompletionRequest) -> None:
    if req.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequestError("best_of is not supported (it must equal n when given)",
                                  param="best_of")
    if req.max_tokens == 0 and not req.echo:
        raise InvalidRequestError("max_tokens must be at least 1 unless echo is true",
                                  param="max_tokens")
