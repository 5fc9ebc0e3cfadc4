from hypothesis import given, settings
from hypothesis import strategies as st

from podium.text.detokenizer import Detokenizer

PIECES = ["🫠", "🦩", "𝄞", "ꙮ"] + list("abc xyz\n\t{}\"'") + ["é", "ß", "你", "好", "世界", "😀", "🚀", "👩‍💻", "🇫🇷",
                                        "ｱ", "\u200d"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


def stream(tokenizer, ids):
    detok = Detokenizer(tokenizer.piece)
    deltas = [detok.feed(t) for t in ids]
    return deltas, detok.flush()


def test_emoji_split_across_tokens_never_yields_replacement(tokenizer):
    ids = tokenizer.encode("Party 🎉 time 你好", add_special=False)
    pieces = [tokenizer.piece(t) for t in ids]
    # the point of the test: some token really carries a partial UTF-8 character
    assert any(_partial(p) for p in pieces)
    deltas, tail = stream(tokenizer, ids)
    assert "".join(deltas) + tail == "Party 🎉 time 你好"
    assert not any("\ufffd" in d for d in deltas)


def _partial(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


@settings(max_examples=200, deadline=None)
@given(TEXTS)
def test_concatenated_deltas_equal_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special=False)
    deltas, tail = stream(tokenizer, ids)
    assert "".join(deltas) + tail == tokenizer.decode(ids) == text
    assert "\ufffd" not in "".join(deltas)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=151_935), max_size=40))
def test_any_token_sequence_matches_one_shot_decode(tokenizer, ids):
    deltas, tail = stream(tokenizer, ids)
    assert "".join(deltas) + tail == tokenizer.decode(ids)


def test_unfinished_character_at_the_end_becomes_one_replacement(tokenizer):
    ids = tokenizer.encode("🫠", add_special=False)
    assert len(ids) == 3
    deltas, tail = stream(tokenizer, ids[:-1])
    assert "".join(deltas) == ""
    assert tail == "\ufffd"


def _reference(tokenizer, ids):
    """Every token's bytes through Python's incremental decoder alone (no remembered texts)."""
    import codecs
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return [decoder.decode(tokenizer.piece(t)) for t in ids], decoder.decode(b"", final=True)


SHARED: dict[int, str] = {}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([11162, 236, 231, 104, 254, 37361, 220, 108386]),
                          st.integers(min_value=0, max_value=151_935)), max_size=40))
def test_each_delta_is_the_incremental_decoders_with_a_shared_table(tokenizer, ids):
    """Remembered whole-character texts (shared across streams, as the server shares them)
    give, token by token, exactly the incremental decoder's deltas, split characters too."""
    detok = Detokenizer(tokenizer.piece, SHARED)
    deltas = [detok.feed(t) for t in ids]
    assert (deltas, detok.flush()) == _reference(tokenizer, ids)


def test_texts_of_is_one_table_per_tokenizer(tokenizer):
    from podium.text.detokenizer import texts_of
    assert texts_of(tokenizer) is texts_of(tokenizer)
    detok = Detokenizer(tokenizer.piece, texts_of(tokenizer))
    ids = tokenizer.encode("hello world", add_special=False)
    assert "".join(detok.feed(t) for t in ids) == "hello world"
    assert all(t in texts_of(tokenizer) for t in ids)
