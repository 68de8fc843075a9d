#!/usr/bin/env python3
"""Renders tests/data/chat_templates/*.jinja on fixed conversations and writes expected.json.

The renderer is transformers' own (render_jinja_template or _compile_jinja_template) when
`transformers` imports; otherwise Jinja2 configured exactly as transformers configures it
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson filter,
raise_exception and strftime_now globals; render(messages=, tools=None, documents=None,
add_generation_prompt=, **special tokens)). expected.json records which one ran.

  /usr/bin/python3 tests/tools/make_chat_template_refs.py   # Debian's python3-jinja2 suffices
"""
import json
import pathlib
import sys

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "chat_templates"

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
U2 = {"role": "user", "content": "Tell me a joke about C++."}
UNICODE = {"role": "user", "content": "Grüß dich! 你好 🌍 — «quotes» \"double\" 'single' \\ backslash\ttab"}
PADDED_U = {"role": "user", "content": "  \n padded question \n\n"}
PADDED_A = {"role": "assistant", "content": "\t answer with spaces  "}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}]
TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}
TOOL_RESULT = {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
TOOL_RESULT_DICT = {"role": "tool", "content": {"temperature": 21, "sky": "clear"}}

CONVERSATIONS = {
    "user": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [U1, A1, U2],
    "system_multi_turn": [SYS, U1, A1, U2],
    "ends_with_assistant": [SYS, U1, A1],
    "unicode": [SYS, UNICODE],
    "whitespace": [{"role": "system", "content": "  spaced system  \n"}, PADDED_U, PADDED_A, U2],
    "roles_not_alternating": [U1, U2],
    "assistant_first": [A1, U1],
}
TOOL_CONVERSATIONS = {
    "tools": ([U1], TOOLS),
    "system_tools": ([SYS, U1], TOOLS),
    "tool_call_round_trip": ([U1, TOOL_CALL, TOOL_RESULT], TOOLS),
    "tool_result_mapping": ([SYS, U1, TOOL_CALL, TOOL_RESULT_DICT], TOOLS),
}

TEMPLATES = {
    # name: (special tokens, conversations with tools, extra template variables)
    "llama-2-chat": ({"bos_token": "<s>", "eos_token": "</s>"}, {}, {}),
    "mistral-7b-instruct-v0.1": ({"bos_token": "<s>", "eos_token": "</s>"}, {}, {}),
    "mistral-7b-instruct-v0.2": ({"bos_token": "<s>", "eos_token": "</s>"}, {}, {}),
    "zephyr-7b-beta": ({"bos_token": "<s>", "eos_token": "</s>"}, {}, {}),
    "llama-3-instruct": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, {}, {}),
    "llama-3.1-instruct": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                           TOOL_CONVERSATIONS, {"date_string": "09 Mar 2025"}),
    "qwen2.5-instruct": ({"bos_token": None, "eos_token": "<|im_end|>"}, TOOL_CONVERSATIONS, {}),
}


def make_renderer():
    try:
        import transformers  # noqa: F401
        from transformers.utils import chat_template_utils as ctu
        name = f"transformers {transformers.__version__}"
        if hasattr(ctu, "render_jinja_template"):
            def render(source, messages, tools, add_generation_prompt, variables):
                rendered, _ = ctu.render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=source,
                    add_generation_prompt=add_generation_prompt, **variables)
                return rendered[0]
            return name, render
        if hasattr(ctu, "_compile_jinja_template"):
            def render(source, messages, tools, add_generation_prompt, variables):
                return ctu._compile_jinja_template(source).render(
                    messages=messages, tools=tools, documents=None,
                    add_generation_prompt=add_generation_prompt, **variables)
            return name, render
    except ImportError:
        pass
    import datetime
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)

    def render(source, messages, tools, add_generation_prompt, variables):
        return env.from_string(source).render(
            messages=messages, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **variables)
    return f"jinja2 {jinja2.__version__} with transformers' settings", render


def main():
    renderer, render = make_renderer()
    cases = []
    for name, (tokens, tool_convs, extra) in TEMPLATES.items():
        source = (DATA / f"{name}.jinja").read_text(encoding="utf-8")
        convs = {k: (v, None) for k, v in CONVERSATIONS.items()}
        convs.update(tool_convs)
        for conv_name, (messages, tools) in convs.items():
            for add_generation_prompt in (False, True):
                variables = {k: v for k, v in tokens.items() if v is not None}
                variables.update(extra)
                case = {"template": name, "conversation": conv_name,
                        "add_generation_prompt": add_generation_prompt,
                        "messages": messages, "variables": variables}
                if tools is not None:
                    case["tools"] = tools
                try:
                    case["expected"] = render(source, messages, tools, add_generation_prompt,
                                              variables)
                except Exception as e:  # raise_exception(...) and runtime errors
                    case["expected_error"] = str(e)
                cases.append(case)
    out = {"renderer": renderer,
           "note": "made by tests/tools/make_chat_template_refs.py; do not edit by hand",
           "cases": cases}
    (DATA / "expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n",
                                        encoding="utf-8")
    print(f"{len(cases)} cases, renderer: {renderer}", file=sys.stderr)


if __name__ == "__main__":
    main()
