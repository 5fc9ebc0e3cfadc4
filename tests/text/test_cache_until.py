"""Where a client's cache breakpoint falls in the prompt's tokens (``generation.cache_until``):
Anthropic's ``cache_control`` and OpenAI's ``prompt_cache_breakpoint`` mark a message part;
the engine is told how many of the prompt's first tokens that covers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from podium.conversation import Conversation, Message, Options, TextPart
from podium.dialect.template import TemplateDialect
from podium.engine.base import SamplingParams
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path
from podium.generation import cache_until
from podium.settings import Settings

GEMMA_TEMPLATE = Path(__file__).parent.parent / "data" / "gemma3.jinja"


@pytest.fixture(scope="module")
def qwen() -> TemplateDialect:
    model = LlamaModel(default_model_path(), vocab_only=True)
    return TemplateDialect.for_model(LlamaTokenizer(model),
                                     model.metadata["tokenizer.chat_template"], Settings())


@pytest.fixture(scope="module")
def gemma() -> TemplateDialect:
    tokenizer = LlamaTokenizer(LlamaModel(default_model_path(GEMMA_MODEL), vocab_only=True))
    return TemplateDialect.for_model(tokenizer, GEMMA_TEMPLATE.read_text(), Settings())


def conversation() -> Conversation:
    return Conversation([
        Message("user", [TextPart("The manual, part one. " * 40),
                         TextPart("The manual, part two. " * 40)], "messages[0]"),
        Message("assistant", [TextPart("Understood.")], "messages[1]"),
        Message("user", [TextPart("Which part mentions two?")], "messages[2]"),
    ], instructions="You answer from the manual. " * 20)


def until(dialect, mark):
    conv, options = conversation(), Options(model="m", sampling=SamplingParams(),
                                            cache_mark=mark)
    prompt = dialect.prompt(conv, options).token_ids
    return cache_until(dialect, conv, options, prompt), prompt


@pytest.mark.parametrize("name", ["qwen", "gemma"])
def test_a_later_breakpoint_covers_more_of_the_prompt(name, request):
    dialect = request.getfixturevalue(name)
    system, prompt = until(dialect, (-1, 0))
    first, _ = until(dialect, (0, 0))
    second, _ = until(dialect, (0, 1))
    turn, _ = until(dialect, (2, 0))
    assert 0 < system < first < second < turn < len(prompt)
    decode = dialect._tokenizer.decode
    # each ends right after its marked text (a template token or two of what follows at most)
    assert "part one" in decode(prompt[:first]) and "part two" not in decode(prompt[:first])
    assert "part two" in decode(prompt[:second])
    assert "Which part" in decode(prompt[:turn])
    assert turn >= len(prompt) - 8          # the last turn: all but the answer's opening


def test_no_mark_is_no_count(qwen):
    assert until(qwen, None)[0] is None


def test_a_mark_that_cannot_be_rendered_is_the_servers_policy(qwen):
    """A mark past the conversation, or a template that refuses the cut conversation, gives
    None (the server's policy), never an error."""
    conv = conversation()
    options = Options(model="m", sampling=SamplingParams(), cache_mark=(7, 0))
    prompt = qwen.prompt(conv, options).token_ids
    assert cache_until(qwen, conv, options, prompt) is None
    strict = TemplateDialect.for_model(qwen._tokenizer, "{{ raise_exception('no') }}",
                                       Settings())
    assert cache_until(strict, conv, replace(options, cache_mark=(0, 0)), prompt) is None
