"""Chat templates: the model's own Jinja template, rendered the way Hugging Face renders it.

The environment is Jinja2's immutable sandbox (no attribute access to Python internals, no
mutation of passed-in data) with the helpers HF templates rely on: ``tojson`` without HTML
escaping, ``raise_exception``, ``strftime_now`` and the ``{% generation %}`` block.
A template's own errors (``raise_exception``, a sandbox violation, a syntax error) are the
client's problem when the client chose the template or the messages that tripped it: 400.

A template may come from the request (``--allow-request-chat-template``), so every render is
bounded while it runs (``TemplateLimits``); crossing a bound is a 400 naming it:

- time: a deadline (CPU time of the rendering thread) checked at every call, filter, loop
  iteration and output chunk;
- values: whatever the template builds (call, filter and operator results, ``~``, literals,
  macro and block output) is measured unfolded, a part held twice counting twice, so that no
  later ``str()``, ``==``, hash or ``tojson`` of it can be large or deep; integers by bits;
- operations that could build something far larger than their inputs are checked before they
  run: repetition, ``**``, widths in ``%`` and ``format``, ``center``/``ljust``/...,
  ``replace``, ``join``, ``indent``, ``wordwrap``, ``batch``/``slice``, ``range``;
- the output, and the total of everything built in one render, are capped;
- a request's template source is capped (compiling is not interruptible).

``lipsum`` and ``pprint`` are left out: no chat template uses them and neither is cheap to bound.
A render holds no state outside its own ``_Budget`` (a context variable), so renders may run
concurrently on worker threads; the compiled templates they share are immutable.

What the template gets from a request is text, never markup: ``Literal`` puts a placeholder
in place of each control token's text in the request's strings before the render, so the
template cannot act on it and the tokenizer reads it back as text (``encode_literal``).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import string
import time
import types
from collections import abc
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Namespace
from jinja2.visitor import NodeTransformer

from podium.engine.base import any_of
from podium.errors import InvalidRequestError

MiB = 1 << 20
T = TypeVar("T")

# The context keys Podium fills in; chat_template_kwargs may not replace them.
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                             "eos_token"})


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend. The defaults fit any conversation an 8 MiB body can carry
    (the default model's template renders 290k one-character messages in about 2 s)."""

    seconds: float = 5.0              # CPU time of one render
    output_chars: int = 32 * MiB      # the rendered prompt
    value_chars: int = 32 * MiB       # characters in any one value, unfolded
    value_items: int = 2 * MiB        # items in any one value, unfolded; range() length
    value_depth: int = 256            # nesting of any one value (deep tuples crash hash())
    int_bits: int = 4096              # integers built by * and **
    built_total: int = 256 * MiB      # characters and items of all values built in one render
    text_filter_chars: int = MiB      # input to filters that go word by word in Python (~1 s)
    source_chars: int = 64 * 1024     # a request's template source (about 1 s to compile)


class _LimitExceeded(Exception):
    """A render crossed one of its ``TemplateLimits``; the message names the limit."""


def _require(ok: bool, what: str, limit: int, unit: str) -> None:
    if not ok:
        raise _LimitExceeded(f"{what} over {limit:,} {unit}")


class _Budget:
    """One render's allowance: a deadline, and what it has built and output so far."""

    __slots__ = ("limits", "deadline", "started", "built", "output")

    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.started = time.thread_time()
        self.built = 0
        self.output = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            self._check_time()

    def _check_time(self) -> None:
        # The limit is this thread's CPU time, so a busy machine does not fail long renders;
        # the wall-clock deadline is only the cheap reminder to look at it.
        left = self.limits.seconds - (time.thread_time() - self.started)
        if left <= 0:
            raise _LimitExceeded(f"rendering ran over its time limit of {self.limits.seconds:g} "
                                 f"s of CPU time")
        self.deadline = time.monotonic() + left

    def accept(self, value: T) -> T:
        """Check a value the template has just built, and charge it to the render. Building is
        bounded by the charge, so no deadline check is needed here (this runs for every ``+``)."""
        if isinstance(value, str):
            self.built += len(value)
            if len(value) > self.limits.value_chars:
                _measure(value, self.limits)    # raises, naming the limit
        else:
            self.built += sum(_measure(value, self.limits))
        if self.built > self.limits.built_total:
            _require(False, "values built in one render totalling", self.limits.built_total,
                     "characters and items")
        return value

    def emit(self, chunk: str) -> None:
        self.output += len(chunk)
        _require(self.output <= self.limits.output_chars, "a rendered prompt of",
                 self.limits.output_chars, "characters")
        self.tick()


_BUDGET: ContextVar[_Budget | None] = ContextVar("podium_template_budget", default=None)


def _budget() -> _Budget:
    # Outside a render (Jinja folding constants while compiling) a fresh allowance applies.
    return _BUDGET.get() or _Budget(TemplateLimits())


def _contents(value: Any) -> Any:
    """What ``str()`` or ``==`` of ``value`` visits past itself, or None for a leaf."""
    if isinstance(value, (list, tuple, set, frozenset, abc.KeysView, abc.ValuesView)):
        return value
    if isinstance(value, abc.Mapping):
        return (*value.keys(), *value.values())
    if isinstance(value, abc.ItemsView):
        return [part for pair in value for part in pair]
    if isinstance(value, Cycler):
        return value.items
    return None


_SCALARS = frozenset({float, bool, type(None)})


def _measure(value: Any, limits: TemplateLimits) -> tuple[int, int]:
    """Characters and items in ``value`` unfolded (a part held twice counts twice), one
    nesting level at a time, stopping at the first limit crossed: the cost is at most the
    limit however much the value shares. A dict's entries count one item each."""
    if isinstance(value, str):
        _require(len(value) <= limits.value_chars, "a string of", limits.value_chars,
                 "characters")
        return len(value), 0
    chars = items = 0
    level = [value]
    for _ in range(limits.value_depth):
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str:
                chars += len(item)
                continue
            if kind is int:
                chars += item.bit_length() // 3 + 1       # about its decimal digits
                continue
            if kind in _SCALARS:
                continue
            if kind is dict:
                items += len(item)
                parts = (*item.keys(), *item.values())
            elif (parts := _contents(item)) is not None:
                items += len(parts)
            else:
                chars += len(item) if isinstance(item, (str, bytes)) else 0
                continue
            if items > limits.value_items:
                _require(False, "a value of", limits.value_items, "items")
            below += parts
        _require(chars <= limits.value_chars, "a value of", limits.value_chars, "characters")
        if not below:
            return chars, items
        level = below
    raise _LimitExceeded(f"a value nested over {limits.value_depth:,} levels")


# --- checks run before an operation that can build far more than it is given ---

def _check_repeat(seq: Any, times: int, limits: TemplateLimits) -> None:
    if times > 0:
        chars, items = _measure(seq, limits)
        _require(chars * times <= limits.value_chars, "a repetition of", limits.value_chars,
                 "characters")
        if not isinstance(seq, (str, bytes)):
            _require(max(items, 1) * times <= limits.value_items, "a repetition of",
                     limits.value_items, "items")


def _check_mul(left: Any, right: Any, limits: TemplateLimits) -> None:
    if isinstance(left, int) and isinstance(right, (str, bytes, list, tuple)):
        left, right = right, left
    if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, int):
        _check_repeat(left, right, limits)
    elif isinstance(left, int) and isinstance(right, int):
        _require(left.bit_length() + right.bit_length() <= limits.int_bits, "an integer product of",
                 limits.int_bits, "bits")


def _check_pow(base: Any, exponent: Any, limits: TemplateLimits) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = (abs(base).bit_length() - 1) * exponent
        _require(bits <= limits.int_bits, "an integer power of", limits.int_bits, "bits")


_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_mod(left: Any, right: Any, limits: TemplateLimits) -> None:
    if isinstance(left, str):
        widths = [w for match in _PERCENT_FIELD.finditer(left) for w in match.groups() if w]
        values = (tuple(right.values()) if isinstance(right, Mapping)
                  else tuple(right) if isinstance(right, (tuple, list)) else (right,))
        _check_formatted(left, left.count("%"), widths, values, limits)


def _check_format(fmt: str, values: tuple, limits: TemplateLimits) -> None:
    fields, widths = 0, []
    for _, name, spec, _ in string.Formatter().parse(fmt):
        if name is not None:
            fields += 1
            widths += _DIGITS.findall(spec or "") + (["*"] if "{" in (spec or "") else [])
    _check_formatted(fmt, fields, widths, values, limits)


def _check_formatted(fmt: str, fields: int, widths: list[str], values: tuple,
                     limits: TemplateLimits) -> None:
    """A formatted string is at most its text plus, per field, its widest width or argument."""
    sizes = [_measure(values, limits)[0]]
    for width in widths:
        if width == "*":        # the width is one of the arguments, or inside one
            sizes += _ints(values, limits)
        else:
            sizes.append(int(width) if len(width) < 12 else limits.value_chars + 1)
    _require(len(fmt) + fields * max(sizes) <= limits.value_chars, "a formatted string of",
             limits.value_chars, "characters")


def _ints(values: tuple, limits: TemplateLimits) -> list[int]:
    """Every integer in ``values`` (already measured, so the walk is bounded)."""
    found, level = [], list(values)
    for _ in range(limits.value_depth):
        below: list[Any] = []
        for item in level:
            if isinstance(item, int):
                found.append(item)
            elif not isinstance(item, (str, bytes)) and (parts := _contents(item)) is not None:
                below += parts
        if not below:
            break
        level = below
    return found


# ``+`` needs no check before it runs: its result is at most twice a value's limit.
_BINOP_CHECKS: dict[str, Callable[[Any, Any, TemplateLimits], None]] = {
    "*": _check_mul, "**": _check_pow, "%": _check_mod}


def _replace_size(text: Any, old: Any, new: Any, count: int = -1) -> int:
    found = text.count(old)
    return len(text) + (found if count < 0 else min(found, count)) * (len(new) - len(old))


def _expandtabs_size(text: Any, tabsize: int = 8) -> int:
    return len(text) + text.count("\t" if isinstance(text, str) else b"\t") * tabsize


def _join_size(sep: Any, parts: Any) -> int:
    if isinstance(parts, (str, bytes)):
        return len(parts) * (1 + len(sep))
    return sum(map(len, parts)) + len(sep) * len(parts)


def _translate_size(text: Any, table: Any) -> int:
    if not isinstance(table, Mapping):
        return len(text)
    return len(text) * max([len(v) for v in table.values() if isinstance(v, str)], default=1)


_METHOD_SIZES: dict[str, Callable[..., int]] = {
    "replace": _replace_size, "expandtabs": _expandtabs_size, "join": _join_size,
    "translate": _translate_size}


def _split_items(text: Any, sep: Any = None, maxsplit: int = -1) -> int:
    pieces = len(text) // 2 + 1 if sep is None else text.count(sep) + 1
    return pieces if maxsplit < 0 else min(pieces, maxsplit + 1)


def _splitlines_items(text: Any, keepends: bool = False) -> int:
    if isinstance(text, bytes):
        return text.count(b"\n") + text.count(b"\r") + 1
    return sum(map(text.count, "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")) + 1


# Methods that build a list: sized before they run, as its strings cost far more than a slot.
_METHOD_ITEMS: dict[str, Callable[..., int]] = {
    "split": _split_items, "rsplit": _split_items, "splitlines": _splitlines_items}


_JINJA_KWARGS = frozenset({"_loop_vars", "_block_vars"})


def _check_method(method: Any, args: tuple, kwargs: dict, limits: TemplateLimits) -> tuple:
    """Size arguments of str, bytes and int methods (``center``, ``zfill``, ``to_bytes``...)
    cannot exceed the value limit, and the amplifying methods are sized before they run.
    Returns the arguments to call with (a lazy iterable to ``join`` is taken into a list)."""
    for arg in (*args, *kwargs.values()):
        _require(not isinstance(arg, int) or arg <= limits.value_chars, "a size argument of",
                 limits.value_chars, "characters")
    name, text = method.__name__, method.__self__
    if not isinstance(text, (str, bytes)):
        return args
    # Jinja adds its own keywords to a call inside a loop or block (its context drops them)
    kwargs = {k: v for k, v in kwargs.items() if k not in _JINJA_KWARGS}
    if name == "join" and args and not isinstance(args[0], abc.Sized):
        args = (list(args[0]), *args[1:])
    if name in _METHOD_SIZES:
        _require(_METHOD_SIZES[name](text, *args, **kwargs) <= limits.value_chars,
                 f"{name}() building a string of", limits.value_chars, "characters")
    elif name in _METHOD_ITEMS:
        _require(_METHOD_ITEMS[name](text, *args, **kwargs) <= limits.value_items,
                 f"{name}() building a list of", limits.value_items, "items")
    return args


# --- the environment ---

class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, operator, ``str.format`` and block output checked."""

    intercepted_binops = frozenset({"+", *_BINOP_CHECKS})

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        if isinstance(obj, types.BuiltinMethodType) and isinstance(
                getattr(obj, "__self__", None), (str, bytes, int)):
            args = _check_method(obj, args, kwargs, budget.limits)
        elif isinstance(obj, Macro) and (obj.catch_varargs or obj.catch_kwargs):
            budget.accept((args, kwargs))       # they become the macro's varargs and kwargs
        return budget.accept(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        if operator != "+":
            _BINOP_CHECKS[operator](left, right, budget.limits)
        return budget.accept(self.binop_table[operator](left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        fmt = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            _check_format(fmt, (*args, *kwargs.values()), _budget().limits)
            return formatter(*args, **kwargs)
        return bounded

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """Joins macro, ``{% set %}`` block, ``{% filter %}`` and ``{% call %}`` output."""
        parts = list(parts)
        budget = _budget()
        _require(sum(map(len, parts)) <= budget.limits.value_chars, "macro or block output of",
                 budget.limits.value_chars, "characters")
        return budget.accept("".join(parts))


class _GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text; render it as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Namespace(Namespace):
    """``namespace()`` whose ``str()`` does not spell out its attributes (they may be shared)."""

    def __repr__(self) -> str:
        return "<Namespace>"


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` as HF calls it. Values too big to be sure of the result's size are
    encoded piecewise (about 6x slower), so a large result stops early."""
    limits = _budget().limits
    options: dict[str, Any] = dict(ensure_ascii=ensure_ascii, indent=indent,
                                   separators=separators, sort_keys=sort_keys)
    step = len(indent) if isinstance(indent, str) else (indent or 0)
    _require(step * limits.value_depth <= limits.value_chars, "a tojson indent of",
             limits.value_chars // limits.value_depth, "characters")
    chars, items = _measure(value, limits)
    per_item = 32 + sum(map(len, separators or ())) + step * limits.value_depth
    if (12 if ensure_ascii else 6) * chars + per_item * items <= limits.value_chars:
        return json.dumps(value, **options)     # escapes and layout cannot outgrow the limit
    return _tojson_piecewise(value, options, limits)


def _tojson_piecewise(value: Any, options: dict, limits: TemplateLimits) -> str:
    chunks, size = [], 0
    for chunk in json.JSONEncoder(**options).iterencode(value):
        size += len(chunk)
        chunks.append(chunk)
        if size > limits.value_chars:
            _require(False, "tojson output of", limits.value_chars, "characters")
        if len(chunks) % 4096 == 0:
            _budget().tick()
    return "".join(chunks)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    limit = _budget().limits.value_chars
    _require(len(fmt) + 64 * fmt.count("%") <= limit, "a strftime result of", limit,
             "characters")
    return datetime.now().strftime(fmt)


def _bounded_range(*args: int) -> range:
    items = range(*args)
    try:
        size = len(items)
    except OverflowError:
        size = None
    limit = _budget().limits.value_items
    _require(size is not None and size <= limit, "a range() of", limit, "items")
    return items


def _iterate(value: Iterable[T]) -> Iterator[T]:
    """Every ``for`` loop iterates through this, so nested loops meet the deadline too."""
    budget = _budget()
    for item in value:
        budget.tick()
        yield item


def _concat(parts: tuple) -> str:
    """The ``~`` operator, sized before it joins."""
    texts = [part if isinstance(part, str) else str(part) for part in parts]
    budget = _budget()
    _require(sum(map(len, texts)) <= budget.limits.value_chars, "a string of",
             budget.limits.value_chars, "characters")
    return budget.accept("".join(texts))


def _literal(value: T) -> T:
    return _budget().accept(value)


def _finalize(value: Any) -> Any:
    """Each ``{{ }}`` output; a non-string becomes a new string, charged to the render."""
    return value if isinstance(value, str) else _budget().accept(str(value))


# --- checks on the arguments of builtin filters (bound to the filter's own parameter names) ---

def _width_check(name: str) -> Callable[[dict, TemplateLimits], None]:
    def check(args: dict, limits: TemplateLimits) -> None:
        _require(int(args[name]) <= limits.value_chars, f"a {name} of", limits.value_chars,
                 "characters")
    return check


def _count_check(name: str) -> Callable[[dict, TemplateLimits], None]:
    def check(args: dict, limits: TemplateLimits) -> None:
        _check_iterable(args, limits)
        _require(int(args[name]) <= limits.value_items, f"a {name} of", limits.value_items,
                 "items")
    return check


def _check_iterable(args: dict, limits: TemplateLimits) -> None:
    """Filters that go item by item in Python meet the deadline at each item; a string given
    as the sequence becomes one item per character."""
    key = "value" if "value" in args else "iterable"
    value = args[key]
    _require(not isinstance(value, str) or len(value) <= limits.value_items,
             "a string iterated as a sequence of", limits.value_items, "items")
    if value:       # some filters test this before they start: keep an empty input empty
        args[key] = _iterate(value)


def _check_text(args: dict, limits: TemplateLimits) -> None:
    text = args["s"] if "s" in args else args["value"]
    _require(len(str(text)) <= limits.text_filter_chars, "a text filter input of",
             limits.text_filter_chars, "characters")


def _check_indent(args: dict, limits: TemplateLimits) -> None:
    text = args["s"] = str(args["s"])
    width = args["width"]
    width = len(width) if isinstance(width, str) else int(width)
    lines = text.count("\n") + 1
    _require(lines <= limits.value_items, "indented text of", limits.value_items, "lines")
    _require(len(text) + lines * width <= limits.value_chars, "indented text of",
             limits.value_chars, "characters")


def _check_wordwrap(args: dict, limits: TemplateLimits) -> None:
    _check_text(args, limits)
    text = args["s"] = str(args["s"])
    wrap = args["wrapstring"] or "\n"
    _require(len(text) * (1 + len(wrap)) <= limits.value_chars, "wrapped text of",
             limits.value_chars, "characters")


def _check_join(args: dict, limits: TemplateLimits) -> None:
    _check_iterable(args, limits)
    if not isinstance(args["value"], abc.Sized):
        args["value"] = list(args["value"])
    chars, items = _measure(args["value"], limits)
    size = chars + 4 * items + len(str(args["d"])) * len(args["value"])
    _require(size <= limits.value_chars, "a joined string of", limits.value_chars, "characters")


def _check_replace(args: dict, limits: TemplateLimits) -> None:
    count = args["count"]
    size = _replace_size(str(args["s"]), str(args["old"]), str(args["new"]),
                         -1 if count is None else int(count))
    _require(size <= limits.value_chars, "replace() building a string of", limits.value_chars,
             "characters")


def _check_format_filter(args: dict, limits: TemplateLimits) -> None:
    _check_mod(str(args["value"]), args["kwargs"] or args["args"], limits)


_FILTER_CHECKS: dict[str, Callable[[dict, TemplateLimits], None]] = {
    "center": _width_check("width"), "indent": _check_indent, "wordwrap": _check_wordwrap,
    "batch": _count_check("linecount"), "slice": _count_check("slices"),
    "join": _check_join, "replace": _check_replace, "format": _check_format_filter,
    **{name: _check_text for name in ("urlize", "title", "striptags", "wordcount",
                                      "urlencode")},
    **{name: _check_iterable for name in ("list", "sort", "unique", "min", "max", "groupby",
                                          "map", "select", "reject", "selectattr",
                                          "rejectattr", "sum")},
}


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Tick before a filter runs, check its arguments if it can amplify, check its result."""
    check = _FILTER_CHECKS.get(name)
    if check is not None:
        func = inspect.unwrap(func)     # the plain sync filter, with its real parameters
        signature = inspect.signature(func)

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        if check is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check(bound.arguments, budget.limits)
            args, kwargs = bound.args, bound.kwargs
        return budget.accept(func(*args, **kwargs))
    return bounded


class _Checkpoints(NodeTransformer):
    """Rewrites a parsed template so that loops, ``~`` and literals pass through the budget."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _filter(node.iter, "podium_iterate")  # type: ignore[arg-type]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _filter(nodes.Tuple(node.nodes, "load", lineno=node.lineno), "podium_concat")

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return _filter(node, "podium_literal")

    visit_Dict = visit_List

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        return _filter(node, "podium_literal") if node.ctx == "load" else node


def _filter(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


def _environment() -> _BoundedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                              extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters.pop("pprint")
    env.globals.pop("lipsum")
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.filters.update(podium_iterate=_iterate, podium_concat=_concat, podium_literal=_literal)
    env.globals.update(range=_bounded_range, namespace=_Namespace,
                       raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    tree = _Checkpoints().visit(_ENV.parse(source))
    tree.set_environment(_ENV)
    return _ENV.from_string(tree)


def _clip(exc: BaseException, limit: int = 500) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


@contextmanager
def _client_errors(param: str) -> Iterator[None]:
    """A template's failures are the client's, who chose the template or the messages."""
    try:
        yield
    except _LimitExceeded as exc:
        raise InvalidRequestError(f"Chat template limit exceeded: {exc}", param=param) from exc
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"Chat template error: {_clip(exc)}", param=param) from exc
    except RecursionError as exc:
        raise InvalidRequestError("Chat template error: calls nested too deeply (RecursionError)",
                                  param=param) from exc
    except MemoryError as exc:
        raise InvalidRequestError("Chat template error: out of memory (MemoryError)",
                                  param=param) from exc
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError,
            RuntimeError) as exc:
        raise InvalidRequestError(f"Chat template could not render these messages: "
                                  f"{_clip(exc)}", param=param) from exc


class ChatTemplate:
    """A compiled chat template plus the special tokens it is rendered with.

    ``from_request``: the client supplied the template, so its failures name ``chat_template``
    (otherwise ``messages``, which tripped the model's own template) and its source is capped.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 from_request: bool = False, limits: TemplateLimits = TemplateLimits()):
        if from_request and len(source) > limits.source_chars:
            raise InvalidRequestError(
                f"Chat template limit exceeded: a template source of over "
                f"{limits.source_chars:,} characters", param="chat_template")
        try:
            self._template = _compile(source)
        except (jinja2.TemplateError, SyntaxError, RecursionError, MemoryError, ValueError,
                OverflowError) as exc:
            # nesting Python's compiler or Jinja's parser cannot take; too long a number
            raise InvalidRequestError(f"Invalid chat template: {_clip(exc)}",
                                      param="chat_template") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._param = "chat_template" if from_request else "messages"
        self._limits = limits

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True,
               extra: Mapping[str, Any] | None = None) -> str:
        """The prompt text. ``extra`` (the request's ``chat_template_kwargs``) adds variables
        but may not replace the ones Podium sets (``RESERVED_KWARGS``): 400."""
        reserved = sorted(RESERVED_KWARGS.intersection(extra or {}))
        if reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: Podium sets them from "
                f"the request and the model", param="chat_template_kwargs")
        context = {**(extra or {}), "messages": messages, "tools": tools or None,
                   "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        budget = _Budget(self._limits)
        token = _BUDGET.set(budget)
        try:
            with _client_errors(self._param):
                return self._generate(context, budget)
        finally:
            _BUDGET.reset(token)

    def _generate(self, context: dict[str, Any], budget: _Budget) -> str:
        chunks = self._template.generate(context)     # a generator: closed below
        try:
            out = []
            for chunk in chunks:
                budget.emit(chunk)
                out.append(chunk)
            return "".join(out)
        finally:
            chunks.close()  # type: ignore[attr-defined]


# Placeholders: supplementary private use areas A and B, without their last two code points
# (noncharacters). No tokenizer gives them a meaning, and no chat template names them.
_PLACEHOLDERS = (range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


@functools.lru_cache(maxsize=16)
def control_pattern(texts: frozenset[str]) -> re.Pattern[str]:
    """``any_of`` the control-token texts of a vocabulary, built once (0.18 s for Gemma's
    6,000) for each vocabulary a path without a dialect meets (Ollama's fill-in-the-middle)."""
    return any_of(texts)


class Literal:
    """Control-token texts (``<|im_end|>``, ``<start_of_turn>``...) in a request's strings
    kept from the template: each becomes a placeholder character that no string of the
    request (nor the template) holds, before the render; ``mapping`` gives each placeholder,
    and its JSON escape (a template's ``tojson(ensure_ascii=True)``), back as its text.

    ``find`` is the pattern of the model's control-token texts. Costs one regex scan of the
    request's strings (no copy) when none holds one, the usual case.
    """

    def __init__(self, find: re.Pattern[str]):
        self._find = find
        self.mapping: dict[str, str] = {}
        self._assigned: dict[str, str] = {}     # text -> placeholder
        self._free_chars = (chr(c) for area in _PLACEHOLDERS for c in area)
        self._avoid = ""

    def protect(self, values: list[Any], taken: str = "") -> list[Any]:
        """``values`` (messages, tools, template variables: any nesting of dicts, lists and
        strings) with placeholders in their strings; ``values`` itself if none needs one.
        ``taken``: text, beside the strings, that placeholders must not be (the template).
        Only the items (of a list in ``values``) holding a control token's text are copied."""
        strings: list[str] = []
        hits = []
        for i, value in enumerate(values):
            for j, item in enumerate(value if isinstance(value, list) else [value]):
                mine: list[str] = []
                _strings(item, mine)
                strings += mine
                if any(map(self._find.search, mine)):
                    hits.append((i, j))
        if not hits:
            return values
        self._avoid = "".join(strings) + taken
        out = [list(value) if isinstance(value, list) else value for value in values]
        for i, j in hits:
            if isinstance(values[i], list):
                out[i][j] = _rebuild(values[i][j], self._sub)
            else:
                out[i] = _rebuild(values[i], self._sub)
        return out

    def _sub(self, text: str) -> str:
        return self._find.sub(self._placeholder, text)

    def _placeholder(self, match: re.Match[str]) -> str:
        text = match.group()
        char = self._assigned.get(text)
        if char is None:
            char = self._assigned[text] = self._free()
            self.mapping[char] = text
            self.mapping[_escaped(char)] = _escaped(text)
        return char

    def _free(self) -> str:
        for char in self._free_chars:
            if char not in self._avoid and _escaped(char) not in self._avoid:
                return char
        raise InvalidRequestError("The request's text uses every private-use character; it "
                                  "cannot be told from the chat template's markup",
                                  param="messages")

    def restore(self, text: str) -> str:
        """``text`` with every placeholder given back as its text."""
        for key, value in self.mapping.items():   # no key holds another, no value a key
            text = text.replace(key, value)
        return text


def _escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _strings(key, out)
            _strings(item, out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _strings(item, out)


def _rebuild(value: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return sub(value)
    if isinstance(value, dict):
        return {_rebuild(key, sub): _rebuild(item, sub) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, sub) for item in value)
    return value
