"""A deterministic engine that replays scripted replies: a test and benchmark harness.

Replies are text or token ids; text goes through a real tokenizer (the GGUF vocabulary of the
model being imitated), so everything above the engine boundary (detokenizer, stop strings,
parsers, renderers) runs exactly as with a real model. It honours max tokens, stop token ids
and aborts, and can be paced (seconds per step, tokens per step). It is not a product path:
``podium serve`` never builds one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from pathlib import Path
from typing import AsyncIterator, Callable, Iterable

from podium.engine.base import (EngineOutput, EngineRequest, EngineStats, ModelInfo, TokenLogprob,
                                Tokenizer)

Reply = str | list[int]


class ScriptedEngine:
    def __init__(self, tokenizer: Tokenizer, info: ModelInfo,
                 replies: Callable[[EngineRequest], Reply] | Iterable[Reply], *,
                 delay: float = 0.0, tokens_per_step: int = 1, keep_requests: int = 64):
        self.tokenizer = tokenizer
        self.info = info
        if callable(replies):
            self._reply = replies
        else:
            cycle = itertools.cycle(list(replies))
            self._reply = lambda _request: next(cycle)
        self.delay = delay
        self.tokens_per_step = max(1, tokens_per_step)
        self._eos = min(tokenizer.eos_token_ids) if tokenizer.eos_token_ids else None
        self._aborted: set[str] = set()
        # the most recent requests, for tests (a benchmark keeps none: survivors of a load
        # would pin allocator arenas and distort its memory figures)
        self.requests: deque[EngineRequest] = deque(maxlen=keep_requests)
        self.stats = EngineStats("running", "waiting", "generated_tokens", "requests")

    @classmethod
    def from_gguf(cls, path: Path, replies: Callable[[EngineRequest], Reply] | Iterable[Reply],
                  *, served_name: str = "scripted", context_length: int = 8192,
                  **pacing: float) -> "ScriptedEngine":
        from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer

        model = LlamaModel(path, vocab_only=True)   # kept alive by the tokenizer
        tokenizer = LlamaTokenizer(model)
        info = ModelInfo(served_name, context_length,
                         model.metadata.get("tokenizer.chat_template"), created=0,
                         metadata=model.metadata)
        return cls(tokenizer, info, replies, **pacing)

    def _script(self, request: EngineRequest) -> list[int]:
        reply = self._reply(request)
        ids = self.tokenizer.encode(reply, add_special=False) if isinstance(reply, str) else reply
        return list(ids) + ([self._eos] if self._eos is not None else [])

    def check_room(self, n: int = 1) -> None:
        """A script has room for any number of requests."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        self.stats["requests"] += 1
        self.stats["running"] += 1
        try:
            async for out in self._replay(request, self._script(request)):
                yield out
        finally:
            self.stats["running"] -= 1
            self._aborted.discard(request.request_id)

    async def _replay(self, request: EngineRequest, script: list[int]
                      ) -> AsyncIterator[EngineOutput]:
        params, produced = request.sampling, 0
        prompt_lp = ([None] + [TokenLogprob(t, 0.0, []) for t in request.prompt_token_ids[1:]]
                     if request.prompt_logprobs is not None else None)
        if params.max_tokens <= 0:
            yield EngineOutput([], None, "length", prompt_lp)
            return
        while True:
            await asyncio.sleep(self.delay)
            if request.request_id in self._aborted:
                yield EngineOutput([], finish_reason="abort")
                return
            step, finish = [], None
            for token in script[produced:produced + self.tokens_per_step]:
                step.append(token)
                produced += 1
                if token in params.stop_token_ids or (token == self._eos and not params.ignore_eos):
                    finish = "stop"
                elif produced >= params.max_tokens:
                    finish = "length"
                if finish:
                    break
            if not step:
                finish = "stop"
            self.stats["generated_tokens"] += len(step)
            logprobs = ([TokenLogprob(t, 0.0, [(t, 0.0)][:request.logprobs]) for t in step]
                        if request.logprobs is not None else None)
            yield EngineOutput(step, logprobs, finish, prompt_lp,
                               stopped_by_token=finish == "stop" and bool(step))
            prompt_lp = None
            if finish:
                return

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def aclose(self) -> None:
        return None
