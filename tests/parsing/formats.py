"""How each family writes tool calls (our own strings, written from the formats)."""

import json


def hermes(calls):
    return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>\n'
                   for n, a in calls)


def qwen3_coder(calls):
    out = ""
    for name, args in calls:
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        out += f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>\n"
    return out


def glm45(calls):
    return "".join(f"<tool_call>{n}\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in a.items())
        + "</tool_call>" for n, a in calls)


def mistral(calls):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in calls)


def mistral_list(calls):
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


def deepseek(calls):
    inner = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>"
                    for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{inner}<｜tool▁calls▁end｜>"


def kimi(calls):
    inner = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>"
                    f"{json.dumps(a)}<|tool_call_end|>" for i, (n, a) in enumerate(calls))
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


def llama3(calls):
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def fenced(calls):
    return "```json\n" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "\n```"


# family -> (writer, content allowed before the calls, XML values: strings only)
FAMILIES = {
    "hermes": (hermes, True), "qwen3_coder": (qwen3_coder, True), "glm45": (glm45, True),
    "mistral": (mistral, True), "deepseek_v3": (deepseek, True), "kimi_k2": (kimi, True),
    "llama3_json": (llama3, False), "json": (fenced, False),
}


# the arguments written before the name (nothing can begin until the name is read)

def hermes_arguments_first(calls):
    return "".join(f'<tool_call>\n{json.dumps({"arguments": a, "name": n})}\n</tool_call>\n'
                   for n, a in calls)


def llama3_arguments_first(calls):
    return "; ".join(json.dumps({"parameters": a, "name": n}) for n, a in calls)


def mistral_list_arguments_first(calls):
    return "[TOOL_CALLS]" + json.dumps([{"arguments": a, "name": n} for n, a in calls])


def fenced_arguments_first(calls):
    return "```json\n" + json.dumps([{"arguments": a, "name": n} for n, a in calls]) + "\n```"


def pythonic(calls):
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                           for n, a in calls) + "]"
