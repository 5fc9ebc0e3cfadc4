"""Grammars that constrain decoding: structured output, and forced tool calls.

``tool_choice: "required"`` (or a named function) constrains the model to write at least one
call to a declared tool, with arguments valid against that tool's schema, in a shape the
family's parser reads: Hermes models write their own ``<tool_call>`` markup; every other
family writes the bare JSON the fallback parser accepts. ``response_format`` constrains the
answer to a JSON object, or to a given JSON schema. Schemas become GBNF through
llama-cpp-python's port of llama.cpp's converter.

Nothing reaches llama.cpp unchecked, because its grammar code fails badly on input it
cannot take: the parser recurses once per nested group (a ``{"maxLength": 30000}`` string
nests 30,000 groups and overflows the stack: a segfault), refuses a repetition of a group
that made more than 2,000 rules (``MAX_REPETITION_THRESHOLD``), and prints every grammar it
refuses, whole, to stderr; a repetition of something that can be empty, which its
left-recursion check misses, makes it allocate without end; a grammar that lets no token
continue makes it abort. A schema is therefore checked twice, and each refusal is a 400
naming the parameter:

1. before conversion, for what the converter cannot take or would take too long over
   (repetition bounds, depth, optional properties, empty unions, references), and
2. the GBNF it makes, by ``check_grammar``: a mirror of llama.cpp's parser that accepts
   nothing llama.cpp would refuse, or could not run safely.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import Any, Mapping, TypeGuard

from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

from podium.errors import InvalidRequestError

# Schema bounds (checked before conversion).
MAX_REPETITION = 1000      # minLength, maxLength, minItems, maxItems, regex {m,n}: the
#                            converter nests one group per optional repetition, and
#                            llama.cpp refuses (threshold) from about 1,000 of them
MAX_SCHEMA_DEPTH = 32      # subschemas inside subschemas
MAX_SCHEMA_NODES = 2000    # subschemas in one request (all tools together)
MAX_OPTIONAL_PROPERTIES = 128   # per object: the converter's work is quadratic in them
MAX_PATTERN_CHARS = 1000   # the converter parses a pattern's groups by recursion
MAX_ENUM = 256             # values of one enum: see MAX_OPEN_ALTERNATIVES

# Grammar bounds (checked on the GBNF itself).
MAX_GRAMMAR_CHARS = 512 * 1024
MAX_NESTING = 1024         # llama.cpp's parser: two C++ frames (under 1 KB) per group
MAX_LEFT_CHAIN = 4096      # its left-recursion check recurses along leftmost references
MAX_LEFT_PATHS = 100_000   # ... and walks every path of them (it does not memoize)
MAX_FIRSTS = 4096          # ways a rule can start: the stacks llama.cpp makes for it
MAX_OPEN_ALTERNATIVES = 256     # ... and what one step can cost: llama.cpp checks each of
#                                 those stacks against every candidate token, so masking
#                                 the 151,936 tokens of the default model cost 0.4-1.7 s for
#                                 an enum of 1,000 values (all open at its opening quote),
#                                 on the worker thread every stream waits for; 256 covers a
#                                 list of countries, and a mask of 256 about 0.1-0.45 s
LLAMA_REPETITION_THRESHOLD = 2000   # MAX_REPETITION_THRESHOLD in llama-grammar.cpp; the
#                                     vendored build refuses a repetition of a group that
#                                     made more than this many symbols (as counted here)
_MAX_CODE_POINT = 0x10FFFF


class GrammarError(ValueError):
    """A GBNF grammar llama.cpp would refuse, or could not parse safely."""


class CheckedGrammar(str):
    """GBNF text that ``check_grammar`` accepted (made by ``checked``); ``param`` is the
    request parameter it was made from, for errors found while it is applied."""

    param: str | None = None


def checked(text: str) -> CheckedGrammar:
    """``text`` as a ``CheckedGrammar``; ``GrammarError`` when the check refuses it."""
    if isinstance(text, CheckedGrammar):
        return text
    check_grammar(text)
    return CheckedGrammar(text)


def schema_grammar(schema: dict[str, Any], param: str, strict: bool = False
                   ) -> CheckedGrammar:
    """The GBNF for JSON valid against ``schema``; a 400 naming ``param`` when it cannot be
    (or, when ``strict``, when the schema has a keyword the grammar would not enforce)."""
    _SchemaCheck(param, "JSON schema: ", strict=strict).run(schema)
    return _checked(_convert(schema, param), param)


def check_strict(schema: dict[str, Any] | None, param: str, prefix: str = "JSON schema: "
                 ) -> None:
    """A 400 naming ``param`` and the keyword when ``schema`` has a keyword Podium's grammar
    does not enforce: strict mode promises output valid against the whole schema, as
    OpenAI's strict mode refuses the keywords it cannot enforce."""
    _SchemaCheck(param, prefix, strict=True).run(schema or {})


def json_object_grammar() -> CheckedGrammar:
    return schema_grammar({"type": "object"}, "response_format")


def tool_call_grammar(schemas: dict[str, dict[str, Any]], family: str, parallel: bool,
                      params: Mapping[str, str] | None = None) -> CheckedGrammar:
    """At least one call (several when ``parallel``) to one of ``schemas``' functions.

    ``params`` names each function's parameters in the request (for errors); without it,
    errors name ``tools`` and the function.
    """
    params = params or {}
    budget = _Budget()
    for name, parameters in schemas.items():
        _SchemaCheck(params.get(name, "tools"), f"Function {name!r} parameters: ", budget).run(
            parameters or {})
    only = params.get(next(iter(schemas)), "tools") if len(schemas) == 1 else "tools"
    call, rules = _call_rules(schemas, only)
    if family == "hermes":
        one = rf'"<tool_call>\n" {call} "\n</tool_call>"'
        root = f"root ::= {one}" + (rf' ("\n" {one})*' if parallel else "")
    else:
        root = (f'root ::= "[" {call} ("," " "? {call})* "]"' if parallel
                else f"root ::= {call}")
    try:
        made = checked(root + "\n" + rules)
    except GrammarError as exc:
        raise _at_fault(schemas, params) or _refusal(exc, only) from None
    made.param = only
    return made


def _call_rules(schemas: dict[str, dict[str, Any]], param: str) -> tuple[str, str]:
    """The rules for one call ``{"name": ..., "arguments": ...}``, and the name of its rule
    (one no other rule has)."""
    alternatives = [{
        "type": "object",
        "properties": {"name": {"const": name},
                       "arguments": parameters or {"type": "object"}},
        "required": ["name", "arguments"],
    } for name, parameters in schemas.items()]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    rules = _convert(schema, param)
    taken = set(re.findall(r"^([a-zA-Z0-9-]+) ::=", rules, flags=re.MULTILINE))
    call, i = "call", 0
    while call in taken:
        call, i = f"call{i}", i + 1
    return call, re.sub(r"^root ::=", f"{call} ::=", rules, count=1, flags=re.MULTILINE)


def _at_fault(schemas: dict[str, dict[str, Any]], params: Mapping[str, str]
              ) -> InvalidRequestError | None:
    """The refusal of the first function whose parameters make a bad grammar alone."""
    for name, parameters in schemas.items():
        param = params.get(name, "tools")
        try:
            checked(_convert(parameters or {}, param))
        except GrammarError as exc:
            return _refusal(exc, param, f"Function {name!r} parameters: ")
    return None


def _checked(grammar: str, param: str) -> CheckedGrammar:
    try:
        made = checked(grammar)
    except GrammarError as exc:
        raise _refusal(exc, param) from None
    made.param = param
    return made


def _refusal(exc: GrammarError, param: str, prefix: str = "JSON schema: ") -> InvalidRequestError:
    return InvalidRequestError(f"{prefix}llama.cpp cannot use the grammar made from it: {exc}",
                               param=param)


# -- the converter ------------------------------------------------------------------------

class _Converter(SchemaConverter):
    """llama-cpp-python's converter, with GBNF string literals escaped properly.

    Its ``_format_literal`` is handed JSON text (consts, enum values, property names) but
    escapes only quotes and line breaks: a value with a backslash or a quote came out as a
    broken literal, or one whose rest reads as grammar rules. Here every backslash and quote
    is escaped, so the literal matches the JSON text exactly; non-ASCII characters are
    written as themselves (the model writes them so) rather than as ``\\u`` escapes.
    """

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def visit(self, schema: Any, name: str) -> str:
        # Two cases the port drops keywords in: a type list (it keeps only the types, so
        # ["string", "null"] lost maxLength) and integer bounds (left as a TODO there).
        if isinstance(schema, dict) and not _dispatched_before_type(schema):
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            types = schema.get("type")
            if isinstance(types, list):
                branches = [{**schema, "type": t} for t in types]
                return self._add_rule(rule_name, self._generate_union_rule(name, branches))
            if types == "integer" and any(k in schema for k in _NUMBER_BOUNDS):
                low, high = integer_bounds(schema)
                return self._add_rule(rule_name, _integer_range(low, high) + " space")
        return super().visit(schema, name)

    def _format_literal(self, literal: str) -> str:
        return '"' + _LITERAL_SPECIAL.sub(lambda m: _LITERAL_ESCAPES[m.group()],
                                          _unescaped(literal)) + '"'


def _dispatched_before_type(schema: dict[str, Any]) -> bool:
    """Whether the port's ``visit`` settles ``schema`` by a keyword it looks at before the
    type: a reference, a union, a constant or an enum."""
    return any(k in schema for k in ("$ref", "anyOf", "oneOf", "const", "enum"))


# -- integer bounds -------------------------------------------------------------------------

_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_INT_LIMIT = 10 ** 16 - 1       # the port's integer rule writes at most 16 digits


def integer_bounds(schema: Mapping[str, Any]) -> tuple[int, int]:
    """The least and greatest integer ``schema``'s bounds allow, within what the grammar's
    16 digits can write (``exclusiveMinimum: true`` is draft 4's spelling)."""
    low, high = -_INT_LIMIT, _INT_LIMIT
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _is_number(minimum):
        low = max(low, math.floor(minimum) + 1 if ex_min is True else math.ceil(minimum))
    if _is_number(maximum):
        high = min(high, math.ceil(maximum) - 1 if ex_max is True else math.floor(maximum))
    if _is_number(ex_min):
        low = max(low, math.floor(ex_min) + 1)
    if _is_number(ex_max):
        high = min(high, math.ceil(ex_max) - 1)
    return low, high


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer_range(low: int, high: int) -> str:
    """A GBNF group matching the JSON integers from ``low`` to ``high`` and nothing else
    (no leading zeros, no ``-0``): one alternative per run of digits that a range of
    equal-length numbers splits into, as a regular expression for a numeric range is built."""
    alternatives = []
    if high >= 0:
        alternatives += _naturals(max(low, 0), high)
    if low < 0:
        alternatives += ['"-" ' + a for a in _naturals(max(1, -high), -low)]
    return "(" + " | ".join(alternatives) + ")"


def _naturals(low: int, high: int) -> list[str]:
    out = []
    for length in range(len(str(low)), len(str(high)) + 1):
        first = 10 ** (length - 1) if length > 1 else 0
        a, b = max(low, first), min(high, 10 ** length - 1)
        if a <= b:
            out += [" ".join(atoms) for atoms in _same_length(str(a), str(b))]
    return out


def _same_length(low: str, high: str) -> list[list[str]]:
    """Sequences of digit atoms covering the numbers from ``low`` to ``high`` (as many
    digits each), sharing no first atom."""
    if not low:
        return [[]]
    rest = len(low) - 1
    if low[0] == high[0]:
        return [[f'"{low[0]}"', *tail] for tail in _same_length(low[1:], high[1:])]
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return [[_digits(int(low[0]), int(high[0])), *["[0-9]"] * rest]]
    out = [[f'"{low[0]}"', *tail] for tail in _same_length(low[1:], "9" * rest)]
    if int(low[0]) + 1 <= int(high[0]) - 1:
        out.append([_digits(int(low[0]) + 1, int(high[0]) - 1), *["[0-9]"] * rest])
    out += [[f'"{high[0]}"', *tail] for tail in _same_length("0" * rest, high[1:])]
    return out


def _digits(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


_LITERAL_SPECIAL = re.compile(r'[\\"\r\n]')
_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}


def _unescaped(text: str) -> str:
    """JSON text with its non-ASCII characters as themselves (other text as it is)."""
    try:
        readable = json.dumps(json.loads(text), ensure_ascii=False)
        readable.encode()           # a lone surrogate stays escaped
    except (ValueError, UnicodeEncodeError):
        return text
    return readable


def _convert(schema: dict[str, Any], param: str) -> str:
    converter = _Converter()
    try:
        copy = json.loads(json.dumps(schema))   # resolve_refs rewrites $ref in place
        root = converter.visit(converter.resolve_refs(copy, "stdin"), "")
        grammar = converter.format_grammar()
    except Exception as exc:  # noqa: BLE001 - the converter raises several kinds
        raise InvalidRequestError(f"Unsupported JSON schema: {_short(str(exc))}",
                                  param=param) from exc
    if root != "root":
        raise InvalidRequestError("Unsupported JSON schema", param=param)
    return grammar


# -- schema bounds --------------------------------------------------------------------------

class _Budget:
    """Subschemas left for one request."""

    def __init__(self) -> None:
        self.nodes = MAX_SCHEMA_NODES


_COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"))
_SUBSCHEMA_MAPS = ("properties", "definitions", "$defs")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMAS = ("items", "additionalProperties")
_NON_EMPTY = ("enum", "anyOf", "oneOf")


class _SchemaCheck:
    """Refuse, naming where, what the converter or llama.cpp cannot take."""

    def __init__(self, param: str, prefix: str, budget: _Budget | None = None,
                 strict: bool = False):
        self.param, self.prefix, self.strict = param, prefix, strict
        self.budget = budget or _Budget()
        self.seen: set[int] = set()
        self.root: Any = None

    def fail(self, where: str, message: str) -> None:
        raise InvalidRequestError(f"{self.prefix}{message} (at {_short(where)})",
                                  param=self.param)

    def run(self, schema: Any) -> None:
        self.root = schema
        self.visit(schema, "#", 0)

    def visit(self, node: Any, where: str, depth: int) -> None:
        if not isinstance(node, dict) or id(node) in self.seen:
            return      # not a schema object: the converter says what is wrong with it
        self.seen.add(id(node))
        self.budget.nodes -= 1
        if self.budget.nodes < 0:
            self.fail(where, f"the schemas have more than {MAX_SCHEMA_NODES} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            self.fail(where, f"schemas nest at most {MAX_SCHEMA_DEPTH} deep")
        self.keywords(node, where)
        for key in _SUBSCHEMA_MAPS:
            for name, sub in _items(node.get(key)):
                if key == "properties" and not name:
                    self.fail(where, "property names must not be empty")
                self.visit(sub, f"{where}/{key}/{name}", depth + 1)
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for i, sub in enumerate(node[key]):
                    self.visit(sub, f"{where}/{key}/{i}", depth + 1)
        for key in _SUBSCHEMAS:
            self.visit(node.get(key), f"{where}/{key}", depth + 1)
        if "$ref" in node:
            self.visit(self.resolve(node["$ref"], where), node["$ref"], depth + 1)

    def keywords(self, node: dict[str, Any], where: str) -> None:
        for key in _NON_EMPTY:
            if key in node and (not isinstance(node[key], list) or not node[key]):
                self.fail(where, f"{key} must be a non-empty list")
        if len(node.get("enum") or ()) > MAX_ENUM:
            self.fail(where, f"an enum may have at most {MAX_ENUM} values")
        if isinstance(node.get("type"), list) and not node["type"]:
            self.fail(where, "type must not be an empty list")
        for low, high in _COUNTS:
            self.bounds(node, where, low, high)
        if "pattern" in node:
            self.pattern(node["pattern"], where)
        self.number_bounds(node, where)
        if self.strict:
            for keyword in unenforced(node):
                self.fail(where, f"keyword {keyword!r} is not enforced by Podium's output "
                                 f"grammar, so strict mode refuses it (without strict it is "
                                 f"accepted and not enforced)")
        required = node.get("required")
        required = {r for r in required if isinstance(r, str)} if isinstance(
            required, list) else set()
        optional = [k for k in _keys(node.get("properties")) if k not in required]
        if len(optional) > MAX_OPTIONAL_PROPERTIES:
            self.fail(where, f"an object may have at most {MAX_OPTIONAL_PROPERTIES} "
                             f"optional (not required) properties; this one has "
                             f"{len(optional)}")

    def bounds(self, node: dict[str, Any], where: str, low: str, high: str) -> None:
        for key in (low, high):
            value = node.get(key)
            if key in node and (not isinstance(value, int) or isinstance(value, bool)
                                or value < 0):
                self.fail(where, f"{key} must be a non-negative integer")
            if key in node and isinstance(value, int) and value > MAX_REPETITION:
                self.fail(where, f"{key} is {value}; Podium constrains output to at most "
                                 f"{MAX_REPETITION} repetitions")
        if low in node and high in node and node[low] > node[high]:
            self.fail(where, f"{low} is more than {high}")

    def number_bounds(self, node: dict[str, Any], where: str) -> None:
        for key in _NUMBER_BOUNDS:
            value = node.get(key)
            exclusive_flag = key.startswith("exclusive") and isinstance(value, bool)
            if key in node and not exclusive_flag and not (
                    _is_number(value) and math.isfinite(value)):
                self.fail(where, f"{key} must be a number")
        if node.get("type") == "integer" and any(k in node for k in _NUMBER_BOUNDS):
            low, high = integer_bounds(node)
            if low > high:
                self.fail(where, f"no integer of at most 16 digits is within the bounds "
                                 f"(from {low} to {high})")

    def pattern(self, pattern: Any, where: str) -> None:
        if not isinstance(pattern, str):
            self.fail(where, "pattern must be a string")
        if len(pattern) > MAX_PATTERN_CHARS:
            self.fail(where, f"patterns are limited to {MAX_PATTERN_CHARS} characters")
        if _CONTROL.search(pattern):
            # the converter copies them raw into the grammar; JSON strings cannot hold them
            self.fail(where, "pattern has a raw control character; write it as an escape")
        for quantifier in _quantifiers(pattern):
            low, high = _quantifier_bounds(quantifier)
            if low is None:
                continue            # not a number: the converter refuses it
            if not 0 <= low <= MAX_REPETITION or (
                    high is not None and not low <= high <= MAX_REPETITION):
                self.fail(where, f"pattern repetition {quantifier} is out of bounds; "
                                 f"Podium allows {{m,n}} with 0 <= m <= n <= "
                                 f"{MAX_REPETITION}")

    def resolve(self, ref: Any, where: str) -> Any:
        """The subschema a local ``$ref`` names, as the converter resolves it."""
        if not isinstance(ref, str) or not ref.startswith("#/"):
            self.fail(where, "only local references ($ref starting with #/) are supported")
        target = self.root
        for part in ref[2:].split("/"):
            if not part or not isinstance(target, dict) or part not in target:
                self.fail(where, f"$ref {_short(ref)!r} names no subschema of this schema")
            target = target[part]
        return target


_CONTROL = re.compile(r"[\x00-\x1f]")


# -- keywords the grammar enforces ----------------------------------------------------------

# Keywords that constrain a JSON value (annotations such as title, description, default and
# examples constrain nothing, so they never count).
_VALIDATION = frozenset((
    "type", "enum", "const", "multipleOf", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "format", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
    "minContains", "maxContains", "unevaluatedItems", "properties", "required",
    "additionalProperties", "patternProperties", "propertyNames", "minProperties",
    "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "$ref", "nullable"))
_FORMATS = frozenset(("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3",
                      "uuid4", "uuid5"))


def unenforced(node: dict[str, Any]) -> list[str]:
    """The validation keywords of one schema object (not its subschemas) that the grammar
    made from it does not enforce: the converter looks at one group of keywords, chosen by
    the first that is present, and ignores the others."""
    honoured = _honoured(node)
    return [k for k, v in node.items() if k in _VALIDATION and k not in honoured
            and not _vacuous(k, v)]


def _vacuous(keyword: str, value: Any) -> bool:
    """Whether a keyword's value constrains nothing (so not enforcing it loses nothing)."""
    return (value is True and keyword in ("additionalProperties", "additionalItems",
                                          "unevaluatedProperties", "unevaluatedItems")
            or value in ([], {}) and keyword in ("required", "properties", "allOf",
                                                  "dependentRequired"))


def _honoured(node: dict[str, Any]) -> set[str]:
    if "$ref" in node:
        return {"$ref"}
    if "oneOf" in node:
        return set()                # written as anyOf: "exactly one" is not enforced
    if "anyOf" in node:
        return {"anyOf"}
    types = node.get("type")
    if isinstance(types, list):     # one branch per type, each keeping the other keywords
        return set().union(*(_honoured({**node, "type": t}) for t in types)) | {"type"}
    if "const" in node or "enum" in node:
        return {"const", "enum", "type"}    # exact values; the type adds nothing
    if types in (None, "object") and ("properties" in node or node.get(
            "additionalProperties", True) is not True):
        required, properties = node.get("required"), node.get("properties")
        listed = isinstance(required, list) and all(
            isinstance(properties, dict) and r in properties for r in required)
        return {"type", "properties", "additionalProperties"} | ({"required"} if listed
                                                                 else set())
    if types in (None, "array") and isinstance(node.get("items"), dict):
        return {"type", "items", "minItems", "maxItems"}
    if types in (None, "array") and ("items" in node or "prefixItems" in node):
        return {"type", "items" if isinstance(node.get("items"), list) else "prefixItems"}
    if types in (None, "string") and "pattern" in node:
        return {"type", "pattern"}
    if types in (None, "string") and node.get("format") in _FORMATS:
        return {"type", "format"}
    if types == "string":
        return {"type", "minLength", "maxLength"}
    if types == "integer":
        return {"type", *_NUMBER_BOUNDS}
    return {"type"}


def _short(text: str, limit: int = 200) -> str:
    """User text quoted in an error, cut short (it may be a megabyte)."""
    return text if len(text) <= limit else text[:limit] + "..."


def _items(value: Any) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _keys(value: Any) -> list[str]:
    return list(value) if isinstance(value, dict) else []


def _quantifiers(pattern: str) -> list[str]:
    """The ``{...}`` quantifiers of a regular expression, read as the converter reads them
    (escapes and character classes skipped)."""
    found, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c == "[":
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif c == "{":
            end = pattern.find("}", i)
            if end < 0:
                break
            found.append(pattern[i:end + 1])
            i = end + 1
        else:
            i += 1
    return found


def _quantifier_bounds(quantifier: str) -> tuple[int | None, int | None]:
    nums = [s.strip() for s in quantifier[1:-1].split(",")]
    try:
        if len(nums) == 1:
            return int(nums[0]), int(nums[0])
        if len(nums) == 2:
            return (int(nums[0]) if nums[0] else 0), (int(nums[1]) if nums[1] else None)
    except ValueError:
        pass
    return None, None


# -- the GBNF check -------------------------------------------------------------------------

def check_grammar(text: str) -> None:
    """Raise ``GrammarError`` unless llama.cpp's grammar parser accepts ``text`` (with a
    ``root`` rule), within bounds that keep it off the end of its stack, and every terminal
    can match some character (a grammar no token can continue makes llama.cpp abort).

    Mirrors ``llama_grammar_parser::parse`` and ``llama_grammar_init_impl`` (llama.cpp as
    vendored by llama-cpp-python 0.3.36), refusing a little more than they do: ``{m,n}``
    repetitions, token references and duplicate rule names (none of which Podium's grammars
    use), and empty character classes.
    """
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar has {len(text)} characters; the limit is "
                           f"{MAX_GRAMMAR_CHARS}")
    if "\x00" in text:
        raise GrammarError("the grammar contains a NUL character")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise GrammarError("the grammar contains a lone surrogate") from None
    rules = _GbnfParser(text).parse()
    _check_expansion(rules)


_SPACE = re.compile(r"[ \t]*(?:\#[^\r\n]*)?")      # spaces, then maybe a comment
_TOKEN = re.compile(_SPACE.pattern + r'''(?:
    (?P<newline>\r\n?|\n)
  | (?P<literal>"(?:[^"\\]|\\.)*")
  | (?P<chars>\[(?:[^\]\\]|\\.)*\])
  | (?P<name>[a-zA-Z0-9-]+)
  | (?P<op>::=|[|()*+?.]))''', re.VERBOSE)
_PLAIN_LITERAL = re.compile(r'(?:[^\\]|\\[trn\\"\[\]-])*', re.DOTALL)
_CHAR = re.compile(r'\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})'
                   r'|([trn\\"\[\]-]))|([^\\])', re.DOTALL)
_SIMPLE_ESCAPES = {"t": 9, "r": 13, "n": 10}
_TERMINAL = None            # an element that matches characters (never empty)
_NOTHING = object()         # an empty literal or class: adds no element


class _Frame:
    """A rule, or a group inside one, being parsed."""

    def __init__(self, key: str | int, nested: bool, symbols_before: int = 0):
        self.key, self.nested, self.symbols_before = key, nested, symbols_before
        self.alternatives: list[list[Any]] = [[]]
        self.last = 0           # where the last item starts (llama.cpp's last_sym_start)
        self.n_prev = 1         # rules that item made (llama.cpp's n_prev_rules)

    def item(self, element: Any, n_prev: int = 1) -> None:
        elements = self.alternatives[-1]
        self.last, self.n_prev = len(elements), n_prev
        if element is not _NOTHING:
            elements.append(element)


class _GbnfParser:
    """llama.cpp's recursive-descent grammar parser, as a loop with an explicit stack.

    Symbols are counted as llama.cpp counts them (a name when first seen, a generated rule
    per group and per repetition), since its repetition threshold depends on the count.
    """

    def __init__(self, text: str):
        self.tokens = self._tokens(text)
        self.i = 0
        self.names: set[str] = set()
        self.generated = 0
        self.rules: dict[str | int, list[list[Any]]] = {}

    @staticmethod
    def _tokens(text: str) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        pos, end = 0, len(text)
        while pos < end:
            m = _TOKEN.match(text, pos)
            if m is None or m.lastgroup is None:
                space = _SPACE.match(text, pos)
                pos = space.end() if space is not None else pos
                if pos < end:
                    raise GrammarError(f"unexpected character {text[pos]!r}")
                break
            tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        return tokens

    def symbol(self, name: str) -> str:
        self.names.add(name)
        return name

    def generate(self) -> int:
        self.generated += 1
        return -self.generated

    @property
    def n_symbols(self) -> int:
        return len(self.names) + self.generated

    def skip_newlines(self) -> None:
        while self.i < len(self.tokens) and self.tokens[self.i][0] == "newline":
            self.i += 1

    def parse(self) -> dict[str | int, list[list[Any]]]:
        self.skip_newlines()
        while self.i < len(self.tokens):
            kind, name = self.tokens[self.i]
            if kind != "name":
                raise GrammarError("expecting a rule name")
            self.i += 1
            if self.i >= len(self.tokens) or self.tokens[self.i][1] != "::=":
                raise GrammarError("expecting ::=")
            self.i += 1
            if name in self.rules:
                raise GrammarError(f"rule {name} is defined twice")
            self.body(self.symbol(name))
            self.skip_newlines()
        undefined = self.names - self.rules.keys()
        if undefined:
            raise GrammarError(f"undefined rule {sorted(undefined)[0]}")
        if "root" not in self.rules:
            raise GrammarError("no root rule")
        return self.rules

    def body(self, name: str) -> None:
        frames = [_Frame(name, nested=False)]
        skip_newlines = True        # right after ::= or |, as llama.cpp's parse_space
        while self.i < len(self.tokens):
            kind, value = self.tokens[self.i]
            self.i += 1
            frame = frames[-1]
            if kind == "newline":
                if frame.nested or skip_newlines:
                    continue
                break
            skip_newlines = value in ("|", "(")
            if kind == "literal":
                frame.item(_literal(value[1:-1]))
            elif kind == "chars":
                frame.item(_chars(value[1:-1]))
            elif kind == "name":
                frame.item(self.symbol(value))
            elif value == "(":
                if len(frames) > MAX_NESTING:
                    raise GrammarError(f"groups nest more than {MAX_NESTING} deep")
                before = self.n_symbols
                frames.append(_Frame(self.generate(), nested=True, symbols_before=before))
            elif value == ")":
                if len(frames) == 1:
                    raise GrammarError("unbalanced )")
                frames.pop()
                self.rules[frame.key] = frame.alternatives
                frames[-1].item(frame.key, max(1, self.n_symbols - frame.symbols_before))
            elif value == "|":
                frame.alternatives.append([])
                frame.last, frame.n_prev = 0, 1
            elif value in "*+?":
                self.repeat(frame, value)
            elif value == ".":
                frame.item(_TERMINAL)
            else:
                raise GrammarError(f"unexpected {value}")
        if len(frames) > 1:
            raise GrammarError("expecting )")
        self.rules[name] = frames[0].alternatives

    def repeat(self, frame: _Frame, op: str) -> None:
        """llama.cpp's rewrite of ``S*``, ``S+`` and ``S?`` into a generated rule."""
        elements = frame.alternatives[-1]
        if frame.last == len(elements):
            raise GrammarError(f"nothing before {op}")
        if frame.n_prev > LLAMA_REPETITION_THRESHOLD:
            raise GrammarError(f"a repetition over {frame.n_prev} rules (llama.cpp's limit "
                               f"is {LLAMA_REPETITION_THRESHOLD})")
        repeated = elements[frame.last:]
        rec = self.generate()
        self.rules[rec] = [repeated + [rec], []] if op in "*+" else [repeated, []]
        if op != "+":
            del elements[frame.last:]
        elements.append(rec)


def _char_at(body: str, pos: int) -> tuple[int, int]:
    """The character at ``pos`` of a literal or class body (escapes decoded as llama.cpp's
    ``parse_char`` does), and where the next one starts."""
    m = _CHAR.match(body, pos)
    if m is None:
        raise GrammarError(f"unknown escape {body[pos:pos + 2]!r}")
    hex_digits = m.group(1) or m.group(2) or m.group(3)
    if hex_digits:
        return int(hex_digits, 16), m.end()
    if m.group(4):
        return _SIMPLE_ESCAPES.get(m.group(4), ord(m.group(4))), m.end()
    return ord(m.group(5)), m.end()


def _literal(body: str) -> Any:
    pos = 0
    if _PLAIN_LITERAL.fullmatch(body):      # raw characters and simple escapes are all fine
        pos = len(body)
    while pos < len(body):
        cp, pos = _char_at(body, pos)
        if cp == 0 or cp > _MAX_CODE_POINT:
            raise GrammarError(f"a literal has character U+{cp:04X}, which no token spells")
    return _TERMINAL if body else _NOTHING


def _chars(body: str) -> Any:
    """A character class: each item a character or, before a ``-`` that is not last, the
    start of a range (llama.cpp's reading)."""
    negated = body.startswith("^")
    pos = 1 if negated else 0
    ranges = []
    while pos < len(body):
        low, pos = _char_at(body, pos)
        high = low
        if body.startswith("-", pos) and pos + 1 < len(body):
            high, pos = _char_at(body, pos + 1)
            if high < low:
                raise GrammarError("a character range runs backwards")
        ranges.append((low, high))
    if not ranges:
        raise GrammarError("an empty character class")
    if not _matches_something(ranges, negated):
        raise GrammarError("a character class matches no character a token can spell")
    return _TERMINAL


def _matches_something(ranges: list[tuple[int, int]], negated: bool) -> bool:
    """Whether some character in U+0001..U+10FFFF (what tokens can spell) is matched."""
    ranges = sorted((max(lo, 1), min(hi, _MAX_CODE_POINT)) for lo, hi in ranges)
    ranges = [(lo, hi) for lo, hi in ranges if lo <= hi]
    if not negated:
        return bool(ranges)
    covered = 0         # every character up to here is excluded
    for lo, hi in ranges:
        if lo > covered + 1:
            return True
        covered = max(covered, hi)
    return covered < _MAX_CODE_POINT


def _check_expansion(rules: dict[str | int, list[list[Any]]]) -> None:
    """Refuse what would make llama.cpp's expansion of a grammar run away.

    llama.cpp refuses left recursion, but sees a rule as possibly empty only when one of
    its alternatives is written empty, so ``root ::= ("a"?) root "b" | "c"`` passes its
    check, and expanding it then allocates until the process dies (found by the property
    test). Here nullability is the real one and every left recursion is refused (also the
    harmless ``("a"?)*``: a pattern ``^(a?)*$`` means ``^a*$``). With none, the expansion
    is finite, but rules shared at the left can multiply the stacks it makes (``R2 ::= R1
    R1`` with R1 nullable, nested), so the ways a rule can start (counted by path) are
    bounded; so are the chain and paths of leftmost references, along which llama.cpp's own
    check recurses without memoizing.
    """
    nullable = _nullable(rules)
    edges: dict[Any, list[Any]] = {}
    starts: dict[Any, int] = {}     # leftmost terminals reachable within the rule itself
    for key, alternatives in rules.items():
        children, terminals = [], 0
        for alternative in alternatives:
            for element in alternative:
                if element is _TERMINAL:
                    terminals += 1
                    break
                children.append(element)
                if element not in nullable:
                    break
        if children:
            edges[key] = children
        starts[key] = terminals
    walk = _LeftWalk(edges, starts)
    for start in list(edges):
        walk.run(start)
    if max(walk.depth.values(), default=1) > MAX_LEFT_CHAIN:
        raise GrammarError("leftmost rule references chain too deep")
    if (sum(walk.paths.values()) + len(rules) > MAX_LEFT_PATHS
            or max(*walk.firsts.values(), *starts.values(), 0) > MAX_FIRSTS):
        raise GrammarError("rules can start in too many ways (as with nested repetitions of "
                           "something that can be empty, like ((a?){2}){2} in a pattern)")
    widest = max(*walk.firsts.values(), *starts.values(), 0)
    if widest > MAX_OPEN_ALTERNATIVES:
        raise GrammarError(f"a value can start in {widest} ways at once (as an enum of "
                           f"{widest} values, or a union of that many); Podium allows at most "
                           f"{MAX_OPEN_ALTERNATIVES}, since llama.cpp checks each of them "
                           f"against the whole vocabulary at a step")


def _nullable(rules: dict[str | int, list[list[Any]]]) -> set[Any]:
    """The rules that can match nothing (worklist: linear in the grammar's size)."""
    missing: dict[tuple[Any, int], int] = {}    # alternative -> elements not known nullable
    users: dict[Any, list[tuple[Any, int]]] = defaultdict(list)
    queue = []
    for key, alternatives in rules.items():
        for i, alternative in enumerate(alternatives):
            if _TERMINAL in alternative:
                continue
            missing[key, i] = len(alternative)
            for element in alternative:
                users[element].append((key, i))
            if not alternative:
                queue.append(key)
    nullable: set[Any] = set()
    while queue:
        key = queue.pop()
        if key in nullable:
            continue
        nullable.add(key)
        for user in users.get(key, ()):
            missing[user] -= 1
            if missing[user] == 0:
                queue.append(user[0])
    return nullable


class _LeftWalk:
    """Depth-first along leftmost references, iteratively: refuses a cycle, and fills in
    each rule's longest chain, number of paths and leftmost terminals (capped numbers)."""

    def __init__(self, edges: dict[Any, list[Any]], starts: dict[Any, int]):
        self.edges, self.starts = edges, starts
        self.depth: dict[Any, int] = {}     # rules without edges: 1, one path, their starts
        self.paths: dict[Any, int] = {}
        self.firsts: dict[Any, int] = {}

    def run(self, start: Any) -> None:
        if start in self.depth:
            return
        edges, in_progress = self.edges, {start}
        stack = [(start, iter(edges[start]))]
        while stack:
            key, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                in_progress.discard(key)
                self.finish(key)
            elif child in in_progress:
                raise GrammarError("left recursion (a rule that can start with itself, or a "
                                   "repetition of something that can be empty, as (a?)* in a "
                                   "pattern)")
            elif child in edges and child not in self.depth:
                in_progress.add(child)
                stack.append((child, iter(edges[child])))

    def finish(self, key: Any) -> None:
        kids, cap = self.edges[key], MAX_LEFT_PATHS + 1
        self.depth[key] = 1 + max(self.depth.get(k, 1) for k in kids)
        self.paths[key] = min(cap, 1 + sum(self.paths.get(k, 1) for k in kids))
        self.firsts[key] = min(cap, self.starts[key] + sum(
            self.firsts.get(k, self.starts.get(k, 0)) for k in kids))
