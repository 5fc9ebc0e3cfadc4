"""Prompts tokenized piece by piece between special tokens, the pieces remembered: the ids
are exactly llama.cpp's for the whole text."""

from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.llamacpp.model import Segments, unambiguous

PIECES = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>", "</s>",
          "<|im_", "|>", "<tool", "_call>", "</", "<", ">", "|", "system", "user", "assistant",
          "\n", "\n\n", " ", "  ", "\t", "Hello", " world", "{\"name\": \"f\"}", "é", "你好",
          "🫠", "'s", "123", "x" * 40]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


def test_the_default_vocabulary_is_tokenized_by_pieces(tokenizer):
    assert tokenizer._segments is not None      # else the tests below prove nothing


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.booleans())
def test_pieces_give_llama_cpps_ids_for_the_whole_text(tokenizer, text, add_special):
    whole = tokenizer._tokenize(text, add_special and tokenizer._add_bos)
    assert tokenizer.encode(text, add_special=add_special) == whole
    assert tokenizer.encode(text, add_special=add_special) == whole    # remembered pieces


def test_a_rendered_conversation_and_its_next_turn(tokenizer, chat_template):
    from podium.text.template import ChatTemplate

    template = ChatTemplate(chat_template, bos_token=tokenizer.bos_token,
                            eos_token=tokenizer.eos_token)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    turns = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Weather in Paris?"}]
    for reply in ("It is sunny in Paris 🌞.", "And tomorrow?"):
        prompt = template.render(turns, tools=tools, add_generation_prompt=True)
        assert tokenizer.encode(prompt) == tokenizer._tokenize(prompt, tokenizer._add_bos)
        turns += [{"role": "assistant", "content": reply}, {"role": "user", "content": "ok"}]


def test_remembered_text_stays_within_its_limit(tokenizer):
    segments = Segments(tokenizer.specials(), tokenizer._tokenize)
    segments.LIMIT_CHARS = 400
    for i in range(200):
        text = f"<|im_start|>user\nmessage number {i} " + "abc " * (i % 7) + "<|im_end|>\n"
        assert segments.encode(text) == tokenizer._tokenize(text)
        assert segments._chars <= 400
        assert segments._chars == sum(map(len, segments._table))


def test_special_tokens_that_could_overlap_turn_pieces_off():
    assert unambiguous({"<a>": 1, "<b>": 2}, 10)
    assert not unambiguous({"<a>": 1, "<a>>": 2}, 10)       # one inside another
    assert not unambiguous({"ab": 1, "bc": 2}, 10)          # "abc": which one?
    assert not unambiguous({"<a>": 1, "<b>": -1}, 10)       # strips blanks, or a shared text
    assert not unambiguous({"": 1}, 10)
    assert not unambiguous({"<a>": 1, "<b>": 2}, 1)         # too many to check
