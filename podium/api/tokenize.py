"""``/tokenize`` and ``/detokenize`` (vLLM's shapes): what the model reads, in tokens.

A ``prompt`` is encoded as it is, a raw prompt in the model's own format: special-token markup
in it (``<|im_start|>``) is parsed as those tokens, as Completions' ``prompt`` is. ``messages``
(with ``tools``) go through the Chat adapter and the model's dialect exactly as a chat request
does, so ``count`` is the prompt a chat request with them would use (clients budget their
context with it), and a control token's text inside a message shows as the text it is.
Embedding models and rerankers tokenize a ``prompt`` too (with their own special tokens: what
an embeddings request of it reads); they have no chat template for ``messages``.
"""

from __future__ import annotations

from typing import Any

from podium.api import chat
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import InvalidRequestError
from podium.generation import check_options, off_loop
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.tokenize import DetokenizeRequest, TokenizeRequest


class TokenizeService:
    def __init__(self, engine: Engine, dialect: Dialect):
        self._engine = engine
        self._dialect = dialect

    async def tokenize(self, req: TokenizeRequest, *, small: bool = False) -> dict[str, Any]:
        ids = await off_loop(self._tokens, req, inline=small)
        out: dict[str, Any] = {"count": len(ids), "max_model_len":
                               self._engine.info.context_length, "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = [self._engine.tokenizer.piece(i).decode("utf-8", "replace")
                                 for i in ids]
        return out

    def _tokens(self, req: TokenizeRequest) -> list[int]:
        tokenizer = self._engine.tokenizer
        if req.prompt is not None:
            return tokenizer.encode(req.prompt, add_special=req.add_special_tokens is not False)
        kind = getattr(self._engine, "kind", "chat")
        if kind != "chat":
            what = "a reranker" if kind == "rerank" else "an embedding model"
            raise InvalidRequestError(f"'{req.model}' is {what}: it has no chat template to "
                                      f"render messages with; give prompt", param="messages")
        wire = ChatCompletionRequest.model_construct(   # validated already, as parts
            model=req.model, messages=req.messages or [], tools=req.tools,
            add_generation_prompt=req.add_generation_prompt,
            chat_template_kwargs=req.chat_template_kwargs)
        options = chat.options(wire, tokenizer.vocab_size)
        check_options(options)
        ids = self._dialect.prompt(chat.conversation(wire), options).token_ids
        if req.add_special_tokens and not ids[:1] == tokenizer.encode("", add_special=True):
            ids = tokenizer.encode("", add_special=True) + ids      # asked: the BOS, once
        return ids

    async def detokenize(self, req: DetokenizeRequest, *, small: bool = False
                         ) -> dict[str, Any]:
        return await off_loop(self._text, req, inline=small)

    def _text(self, req: DetokenizeRequest) -> dict[str, Any]:
        vocab = self._engine.tokenizer.vocab_size
        for i, token in enumerate(req.tokens):
            if not 0 <= token < vocab:
                raise InvalidRequestError(f"token {token} is not in the model's vocabulary "
                                          f"(0 to {vocab - 1})", param=f"tokens[{i}]")
        return {"prompt": self._engine.tokenizer.decode(req.tokens)}
