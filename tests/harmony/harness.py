"""A stand-in gpt-oss for tests: the real o200k_harmony vocabulary on the scripted engine.

gpt-oss is far too large to run here; its GGUF vocabulary is openai-harmony's encoding, so
replies rendered by openai-harmony into token ids and replayed by the scripted engine reach
Podium exactly as a real gpt-oss's tokens would.
"""

from __future__ import annotations

import base64
import functools
import os
from pathlib import Path

import openai_harmony as oh

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.harmony.vocab import FILE_NAME, ensure_vocabulary

SERVED = "gpt-oss-test"


@functools.cache
def encoding() -> oh.HarmonyEncoding:
    ensure_vocabulary()
    return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)


class HarmonyTokenizer:
    """o200k_harmony as a Podium tokenizer (ordinary pieces from the vocabulary file)."""

    vocab_size = 201088
    bos_token = "<|startoftext|>"
    eos_token = "<|return|>"
    # Harmony's markup: special tokens in a grammar (as llguidance reads gpt-oss's vocabulary)
    grammar_specials = frozenset({"<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                  "<|constrain|>", "<|return|>", "<|call|>", "<|endoftext|>"})

    def __init__(self) -> None:
        self._enc = encoding()
        self.eos_token_ids = frozenset(self._enc.encode("<|return|>", allowed_special="all"))
        path = Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / FILE_NAME
        self._pieces = [base64.b64decode(line.split()[0])
                        for line in path.read_bytes().splitlines()]

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._enc.encode(text, allowed_special="all")

    def piece(self, token_id: int) -> bytes:
        if token_id < len(self._pieces):
            return self._pieces[token_id]
        return self._enc.decode([token_id]).encode()

    def decode(self, token_ids: list[int]) -> str:
        return self._enc.decode(token_ids)


@functools.cache
def tokenizer() -> HarmonyTokenizer:
    return HarmonyTokenizer()


def engine(replies, **pacing) -> ScriptedEngine:
    info = ModelInfo(SERVED, 8192, None, created=0, metadata={"general.architecture": "gpt-oss"})
    return ScriptedEngine(tokenizer(), info, replies, **pacing)


# -- assistant turns as a gpt-oss would write them ----------------------------------------

def analysis(text: str) -> oh.Message:
    return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("analysis")


def preamble(text: str) -> oh.Message:
    return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("commentary")


def final(text: str) -> oh.Message:
    return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("final")


def call(name: str, arguments: str) -> oh.Message:
    return (oh.Message.from_role_and_content(oh.Role.ASSISTANT, arguments)
            .with_channel("commentary").with_recipient(f"functions.{name}")
            .with_content_type("<|constrain|>json"))


def completion(*messages: oh.Message) -> list[int]:
    """The tokens a model writes after a prompt ending in ``<|start|>assistant``.

    Each message is rendered by openai-harmony; a call not last in the turn ends with
    ``<|end|>`` (at ``<|call|>`` generation stops for the tool's result), and a closing
    ``final`` message ends with ``<|return|>``.
    """
    enc = encoding()
    end, call_token, ret = enc.encode("<|end|><|call|><|return|>", allowed_special="all")
    tokens: list[int] = []
    for i, message in enumerate(messages):
        rendered = enc.render(message)
        last = i == len(messages) - 1
        if rendered[-1] == call_token and not last:
            rendered[-1] = end
        if rendered[-1] == end and last and message.channel == "final":
            rendered[-1] = ret
        tokens += rendered
    return tokens[2:]        # the prompt already holds <|start|>assistant
