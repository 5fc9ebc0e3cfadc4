"""quoted_lark: a custom tool's grammar, constrained as the JSON string that holds its input.

An llguidance matcher over a byte-level tokenizer (256 byte tokens + EOS, no model) reads
the rewritten grammar; the language of each client grammar is known independently (Python's
``re`` for regexes in the subset both dialects share, ``json`` for the JSON grammar, a patch
builder for Codex's apply_patch grammar).
"""

from __future__ import annotations

import json
import re
from functools import cache

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.errors import InvalidRequestError
from podium.grammar.escaped import MAX_DEFINITION_CHARS, quoted_lark

PARAM = "tools[0].format.definition"

# openai/codex codex-rs/core/src/tools/handlers/tool_apply_patch.lark, as published
APPLY_PATCH = r'''start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
'''

# JSON without insignificant whitespace: recursive, so value/array/object stay rules
JSON_GRAMMAR = r'''?start: value
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
'''

# regexes both Python's re and Rust's regex read alike (no \d \w \s: Unicode differs)
REGEXES = [
    r'[a-z"\\]+',                 # quote and backslash
    r"(.|\n)*",                   # newline by alternation; . without it
    r"(?s:.)*end",                # dot-all
    r"[^a-z\n]{0,8}",             # negated class: controls, quote, backslash all inside
    "[\t\x01-\x03 ]+x?",          # tab and control characters, raw in the regex
    r"é+(ab|c\x22d)?[😀-😂]*",      # non-ASCII, an escaped quote, astral ranges
    r"a\tb\x7f?\u00e9",           # escapes in the regex itself, DEL
]


class ByteTokenizer:
    """256 one-byte tokens and an EOS: llguidance checks the text byte by byte."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))


@cache
def matcher(syntax: str, definition: str) -> llguidance.LLMatcher:
    grammar = "start: ci_input\n" + quoted_lark(syntax, definition, PARAM)
    made = llguidance.LLMatcher(TOKENIZER, llguidance.LLMatcher.grammar_from_lark(grammar),
                                log_level=0)
    assert not made.is_error(), made.get_error()
    return made


def accepts(syntax: str, definition: str, text: str) -> bool:
    """Whether the rewritten grammar takes ``text`` (a JSON string, quotes included) whole."""
    fresh = matcher(syntax, definition).deep_copy()
    return (fresh.consume_tokens(list(text.encode())) and not fresh.is_error()
            and fresh.is_accepting())


def quoted(value: str) -> str:
    """``json.dumps`` as the model writes it (raw Unicode); DEL escaped, as llguidance's JSON
    strings require."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


# --- regexes -------------------------------------------------------------------------------


@pytest.mark.parametrize("syntax", ["regex", "lark"])
@pytest.mark.parametrize("regex", REGEXES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_regex_language_is_accepted_escaped(syntax: str, regex: str, data: st.DataObject
                                            ) -> None:
    value = data.draw(st.from_regex(regex, fullmatch=True))
    definition = regex if syntax == "regex" else f"start: /{regex}/"
    assert accepts(syntax, definition, quoted(value))


@pytest.mark.parametrize("syntax", ["regex", "lark"])
@pytest.mark.parametrize("regex", REGEXES)
@settings(max_examples=60, deadline=None)
@given(value=st.text(alphabet=st.sampled_from('ab"\\\n\t\x01\x1f\x7fé😀 zend/')))
def test_strings_outside_the_language_are_refused(syntax: str, regex: str, value: str) -> None:
    definition = regex if syntax == "regex" else f"start: /{regex}/"
    assert accepts(syntax, definition, quoted(value)) == bool(re.fullmatch(regex, value))


@pytest.mark.parametrize("regex", REGEXES)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_raw_newline_or_quote_is_accepted_only_as_an_escape_of_the_language(regex: str, data: st.DataObject) -> None:
    value = data.draw(st.from_regex(regex, fullmatch=True))
    body = quoted(value)[1:-1]
    at = data.draw(st.integers(0, len(body)))
    broken = '"' + body[:at] + data.draw(st.sampled_from(['"', "\n", "\x01"])) + body[at:] + '"'
    for syntax, definition in (("lark", f"start: /{regex}/"), ("regex", regex)):
        if accepts(syntax, definition, broken):     # only where it made an escape (\" )
            decoded = json.loads(broken)            # raises for raw controls or a bare "
            assert isinstance(decoded, str) and re.fullmatch(regex, decoded), broken


def test_control_characters_take_every_json_escape() -> None:
    lark = r"start: /[\t\x01]+/"
    for text in [r'"\t"', r'"\u0009"', r'"\u0001\U0001"'.replace(r"\U", r"\u"), r'"\u001"']:
        assert accepts("lark", lark, text) == (text != r'"\u001"'), text
    assert not accepts("lark", lark, '"\t"')           # a raw tab is not JSON
    assert not accepts("lark", r"start: /a\/b/", r'"a\/b"')   # one spelling of "/"


# --- Codex's apply_patch -------------------------------------------------------------------

LINE = st.text(st.characters(blacklist_characters="\n\x7f", blacklist_categories=("Cs",)),
               max_size=20)


@st.composite
def patches(draw: st.DrawFn) -> str:
    hunks = []
    for _ in range(draw(st.integers(1, 3))):
        name = "f" + draw(LINE)
        kind = draw(st.sampled_from(["add", "delete", "update"]))
        if kind == "add":
            lines = draw(st.lists(LINE, min_size=1, max_size=4))
            hunks.append(f"*** Add File: {name}\n" + "".join(f"+{x}\n" for x in lines))
        elif kind == "delete":
            hunks.append(f"*** Delete File: {name}\n")
        else:
            changes = draw(st.lists(st.tuples(st.sampled_from("+- "), LINE), max_size=4))
            hunks.append(f"*** Update File: {name}\n@@ def f():\n"
                         + "".join(f"{op}{x}\n" for op, x in changes))
    return "*** Begin Patch\n" + "".join(hunks) + "*** End Patch\n"


@settings(max_examples=60, deadline=None)
@given(patch=patches())
def test_apply_patch_accepts_escaped_patches(patch: str) -> None:
    assert accepts("lark", APPLY_PATCH, quoted(patch))


@settings(max_examples=60, deadline=None)
@given(patch=patches(), data=st.data())
def test_apply_patch_refuses_broken_patches(patch: str, data: st.DataObject) -> None:
    broken = data.draw(st.sampled_from([
        patch.replace("*** End Patch\n", ""),                 # no end
        patch.replace("*** Begin Patch\n", "*** Begin patch\n"),
        patch.replace("\n", "\r\n"),                          # CR is not in the language
        patch + "trailing",
    ]))
    assert not accepts("lark", APPLY_PATCH, quoted(broken))
    assert not accepts("lark", APPLY_PATCH, json.dumps(patch)[:-1] + '\n"')


def test_apply_patch_sample() -> None:
    patch = ('*** Begin Patch\n*** Update File: src/a "b".py\n@@ class A:\n'
             '-    s = "x\\ty"\n+    s = "tab\there"\n*** End of File\n*** End Patch\n')
    assert accepts("lark", APPLY_PATCH, quoted(patch))
    assert not accepts("lark", APPLY_PATCH, quoted(patch.replace("@@ class", "@ class")))


# --- a recursive grammar: JSON -------------------------------------------------------------

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(value=VALUES, ascii_only=st.booleans())
def test_json_grammar(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)
    assert accepts("lark", JSON_GRAMMAR, quoted(text))
    assert not accepts("lark", JSON_GRAMMAR, quoted(text + "]"))
    assert not accepts("lark", JSON_GRAMMAR, quoted(" " + text))


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("syntax, definition, construct", [
    ("lark", "start: /^a/", "anchor"),
    ("lark", "start: /a(?=b)b/", "lookaround"),
    ("lark", "start: /a+?/", "lazy quantifier"),
    ("lark", r"start: /(a)\1/", "escape '\\1'"),
    ("lark", r"start: /\p{L}/", "escape '\\p'"),
    ("lark", "start: /a/i", "flags"),
    ("lark", 'start: "a"i', "case-insensitive"),
    ("lark", "start: A\nA: /a/\n%ignore / /", "%ignore"),
    ("lark", "start: a\nb: c", "no 'start'"[:0] + "undefined"),
    ("lark", "start: x{1,2}", "does not parse"),
    ("lark", "%import python.NAME\nstart: NAME", "%import python.NAME"),
    ("lark", "start: /a{1,99999}/", "repetition"),
    ("regex", "a(?=b)", ""),
    ("regex", "(", ""),
    ("gbnf", "root ::= x", "unknown grammar syntax"),
    ("lark", "x" * (MAX_DEFINITION_CHARS + 1), "longer than"),
])
def test_refusals_are_400s_naming_the_param(syntax: str, definition: str, construct: str
                                            ) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        quoted_lark(syntax, definition, PARAM)
    assert caught.value.status_code == 400 and caught.value.param == PARAM
    assert construct in caught.value.message


def test_names_are_prefixed() -> None:
    rules = quoted_lark("lark", "start: a\na: B\nB: /b/", PARAM, prefix="t3")
    names = [line.split(":")[0] for line in rules.splitlines()]
    assert names and all(n.lower().startswith("t3_") for n in names)
    assert names[0] == "t3_input"
