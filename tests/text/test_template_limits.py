"""A chat template, even a hostile one sent with the request, ends quickly in a 400 naming
the limit it crossed; the model's own template still renders the longest conversations."""

import threading
import time

import pytest

from podium.errors import InvalidRequestError
from podium.text.template import ChatTemplate, TemplateLimits
from tests.conftest import SERVED

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
QUICK = TemplateLimits(seconds=0.5)


def refused(source: str, messages=USER, *, limits=TemplateLimits(), from_request=True,
            within: float = 5.0) -> InvalidRequestError:
    """Render ``source``; it must fail with a 400 in under ``within`` seconds."""
    template = ChatTemplate(source, from_request=from_request, limits=limits)
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as caught:
        template.render(messages)
    assert time.monotonic() - started < within
    return caught.value


def test_nested_range_loops_stop_at_the_deadline():
    error = refused("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}", limits=QUICK, within=3)
    assert error.param == "chat_template" and "time limit of 0.5 s" in error.message


def test_nested_loops_over_data_stop_at_the_deadline():
    error = refused("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
                    "{% endfor %}{% endfor %}{% endfor %}", USER * 2000, limits=QUICK, within=3)
    assert "time limit" in error.message


@pytest.mark.parametrize("source", [
    "{{ 'a' * 100000000 }}",
    "{{ [0] * 100000000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{% set a = 'x' * 1000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}"
    "{% set e = d ~ d %}{% set f = e ~ e %}{% set g = f ~ f %}",
])
def test_repetition_and_doubling_are_refused_before_memory_runs_out(source):
    assert "over 33,554,432 characters" in refused(source, within=2).message


def test_range_is_capped():
    for source in ("{{ range(10**9) }}", "{% for i in range(10**100) %}{% endfor %}"):
        error = refused(source, within=1)
        assert "range() of over 2,097,152 items" in error.message


def test_recursive_macro_is_a_400():
    error = refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", within=2)
    assert error.param == "chat_template" and "RecursionError" in error.message


def test_output_is_capped_while_rendering():
    limits = TemplateLimits(output_chars=10_000)
    error = refused("{% for i in range(2000000) %}0123456789{% endfor %}", limits=limits,
                    within=1)
    assert "rendered prompt of over 10,000 characters" in error.message


def test_huge_integers_are_refused():
    # Jinja's ** groups to the left: 10**10**10 is (10**10)**10, a 101-digit number.
    assert ChatTemplate("{{ 10**10**10 }}").render([]) == "1" + "0" * 100
    assert "integer power" in refused("{{ 10 ** (10 ** 10) }}", within=1).message
    squaring = ("{% set ns = namespace(x=3) %}{% for i in range(64) %}"
                "{% set ns.x = ns.x * ns.x %}{% endfor %}")
    assert "integer product" in refused(squaring, within=1).message


@pytest.mark.parametrize("source", [
    "{{ 'a'|center(10**9) }}", "{{ 'a'.ljust(10**9) }}", "{{ 'a'.zfill(10**9) }}",
    "{{ '%0999999999d' % 1 }}", "{{ '%*d' % (999999999, 1) }}", "{{ '{:>999999999}'.format(1) }}",
    "{{ '{:>{w}}'.format(1, w=999999999) }}",
    "{{ ('{0}' * 1000).format('x' * 1000000) }}",
    "{{ ('a' * 1000000).replace('', 'b' * 1000) }}",
    "{{ ('a' * 1000000)|replace('', 'b' * 1000) }}",
    "{{ range(1000000)|join('x' * 1000) }}",
    "{{ ('x' * 1000).join(range(100000)|map('string')|list) }}",
    "{{ ('\n' * 1000000)|indent(1000) }}",
    "{{ ('\t' * 1000000).expandtabs(1000) }}",
    "{{ (1).to_bytes(10**9, 'big') }}",
    "{{ ('a b' * 10000000).split('b')|length }}",
    "{{ [1]|batch(10**9, 'x')|list }}",
    "{{ ('ab ' * 1000000)|wordwrap(1) }}",
    "{% set h = ['x' * 100000] %}{{ [h, h, h, h, h, h, h, h, h, h] * 100 }}",
    "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}"
    "{{ m()|length }}",
])
def test_amplifying_operations_are_sized_before_they_run(source):
    assert "limit exceeded" in refused(source, within=2).message


def test_shared_parts_count_each_time_they_appear():
    nested = "{% set a0 = ['x' * 1000] %}" + "".join(
        f"{{% set a{i + 1} = [a{i}, a{i}, a{i}, a{i}] %}}" for i in range(20)) + "{{ a20 }}"
    assert "over 33,554,432 characters" in refused(nested, within=2).message


def test_deep_nesting_cannot_crash_hash():
    # hash() of a tuple nested a million deep overflows the C stack: a segfault, not an error
    source = ("{% set ns = namespace(t=()) %}{% for i in range(1000000) %}"
              "{% set ns.t = (ns.t,) %}{% endfor %}{{ ns.t in {} }}")
    assert "nested over 256 levels" in refused(source, within=2).message


def test_everything_built_in_one_render_is_capped():
    source = "{% set h = 'x' * 30000000 %}" + "".join(
        f"{{% set v{i} = h ~ {i} %}}" for i in range(40))
    assert "values built in one render" in refused(source, within=5).message


def test_template_source_from_a_request_is_capped():
    with pytest.raises(InvalidRequestError, match="template source of over 65,536") as caught:
        ChatTemplate("{{ x }}" * 20_000, from_request=True)
    assert caught.value.param == "chat_template"


@pytest.mark.parametrize("source", [
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{% for a in x %}" * 30 + "{% endfor %}" * 30,
    "{{ " + "9" * 5000 + " }}",
])
def test_templates_python_cannot_compile_are_400(source):
    with pytest.raises(InvalidRequestError, match="Invalid chat template") as caught:
        ChatTemplate(source, from_request=True)
    assert caught.value.param == "chat_template"


def test_errors_blame_messages_when_the_template_is_the_models():
    limits = TemplateLimits(output_chars=1000)
    error = refused("{% for m in messages %}{{ m.content }}{% endfor %}",
                    [{"role": "user", "content": "x" * 2000}], limits=limits, from_request=False)
    assert error.param == "messages"
    error = refused("{{ cycler() }}", from_request=False)     # a RuntimeError in Jinja
    assert error.param == "messages"


def test_error_messages_are_clipped():
    error = refused("{{ raise_exception('x' * 10000000) }}")
    assert len(error.message) < 1000


def test_real_template_renders_the_longest_conversation_a_body_can_carry(chat_template):
    # An 8 MiB body holds about 290k of the smallest messages.
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"}
                for i in range(290_000)]
    out = ChatTemplate(chat_template).render(messages, extra={"enable_thinking": False})
    assert out.count("<|im_start|>") == 290_002
    long = [{"role": "user", "content": "y" * 8_000_000}]
    assert len(ChatTemplate(chat_template).render(long)) > 8_000_000


def test_renders_run_side_by_side_on_threads(chat_template):
    template, hostile = ChatTemplate(chat_template), ChatTemplate(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        from_request=True, limits=QUICK)
    results: list = []

    def render(t):
        try:
            results.append(t.render(USER))
        except InvalidRequestError as exc:
            results.append(exc)
    threads = [threading.Thread(target=render, args=(t,)) for t in (hostile, template) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(isinstance(r, InvalidRequestError) for r in results) == 2
    assert sum(isinstance(r, str) and r.endswith("<|im_start|>assistant\n") for r in results) == 2


# --- through the API ---

def post(client, body, *, within: float = 30.0):
    """POST in a thread so a wedged server fails the test instead of hanging it."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(client.post(CHAT, json=body)),
                              daemon=True)
    worker.start()
    worker.join(within)
    assert box, f"no answer within {within} s"
    return box[0]


def chat(**extra):
    return {"model": SERVED, "messages": USER, **extra}


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'a' * 100000000 }}",
    "{{ range(10**9) }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 10 ** (10 ** 10) }}",
])
def test_hostile_request_template_is_a_400_and_the_server_goes_on(scripted, client_for,
                                                                   source):
    client = client_for(scripted(["ok", "ok"]), allow_request_chat_template=True)
    r = post(client, chat(chat_template=source))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "chat_template"
    assert "chat template" in r.json()["error"]["message"].lower()
    assert client.get("/health").status_code == 200
    assert post(client, chat(chat_template="{{ messages[0].content }}")).status_code == 200


@pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt", "bos_token",
                                 "eos_token"])
def test_reserved_chat_template_kwargs_are_400(scripted, client_for, key):
    engine = scripted(["ok", "ok"])
    client = client_for(engine)
    r = post(client, chat(chat_template_kwargs={key: "x"}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "chat_template_kwargs"
    assert key in r.json()["error"]["message"]
    ok = post(client, chat(chat_template_kwargs={"enable_thinking": False, "custom": 1}))
    assert ok.status_code == 200
