#!/usr/bin/env python3
"""Reference renders for moecel's chat templates and Jinja engine, produced by jinja2 configured exactly the way
transformers configures it (run with /root/venv/bin/python from anywhere):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
  with transformers' `tojson` filter (json.dumps, ensure_ascii=False) and its globals raise_exception,
  strftime_now, dict and namespace; messages normalised like apply_chat_template (keys whose value is None
  dropped, reasoning fields aliased), special tokens from the tokenizer config passed as variables.

Writes into tests/golden/chat_template/:
  chat_cases.json      conversations x templates x add_generation_prompt -> expected text, or the
                       raise_exception() message ("raises"), or another jinja2 error ("error").
  jinja_snippets.json  small templates + contexts probing the engine (operators, filters, tests, whitespace
                       control, Python formatting of values) -> expected text or error.

The templates are the *.jinja files next to the goldens plus Qwen3's real template from
shared/data/tokenizers/qwen3/tokenizer_config.json. Where transformers is importable every render is
cross-checked with transformers' own render_jinja_template (and Qwen3 with AutoTokenizer.apply_chat_template).
"""
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
OUT = os.path.join(ROOT, "tests", "golden", "chat_template")
QWEN3_CONFIG = "data/tokenizers/qwen3/tokenizer_config.json"  # relative to the shared folder
SPECIAL_TOKEN_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


# ---------------------------------------------------------------- the environment transformers builds
def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                if isinstance(name, str) and name.startswith("_"):
                    raise jinja2.exceptions.SecurityError(f"underscore attribute {name!r}")
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"underscore attribute {name!r}")
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = lambda *a, **k: dict(*a, **k)
    env.globals["namespace"] = TemplateNamespace
    return env


ENV = make_env()


def outcome(fn):
    """Runs fn() -> {"expected": text} | {"raises": message} | {"error": "Type: message"}."""
    try:
        return {"expected": fn()}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": f"TemplateSyntaxError: {e}"}
    except Exception as e:  # noqa: BLE001 - every failure is a recorded outcome
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception() in the template
            return {"raises": str(e)}
        return {"error": f"{type(e).__name__}: {e}"}


def normalize_messages(messages):
    # apply_chat_template: drop keys whose value is None, then alias the reasoning fields.
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render_chat(source, messages, add_generation_prompt, extra, special_tokens):
    kwargs = {**special_tokens, **copy.deepcopy(extra)}
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    template = ENV.from_string(source)
    return template.render(messages=normalize_messages(copy.deepcopy(messages)), tools=tools, documents=documents,
                           add_generation_prompt=add_generation_prompt, **kwargs)


def transformers_render(source, messages, add_generation_prompt, extra, special_tokens):
    from transformers.utils.chat_template_utils import render_jinja_template
    kwargs = {**special_tokens, **copy.deepcopy(extra)}
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    msgs = [{k: v for k, v in m.items() if v is not None} for m in copy.deepcopy(messages)]
    rendered, _ = render_jinja_template(conversations=[msgs], tools=tools, documents=documents, chat_template=source,
                                        add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0]


# ---------------------------------------------------------------- templates and conversations
def special_tokens_of(config):
    out = {}
    for k in SPECIAL_TOKEN_KEYS:
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def load_templates():
    templates = {}
    with open(os.path.join(SHARED, QWEN3_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    templates["qwen3"] = {"tokenizer_config": QWEN3_CONFIG, "source": cfg["chat_template"],
                          "special_tokens": special_tokens_of(cfg)}
    files = {
        # Tulu-style template of allenai/OLMoE-1B-7B-0125-Instruct (bos = eos = <|endoftext|>).
        "olmoe_instruct": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
        "mixtral_instruct": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "llama2_chat": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "chatml": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "zephyr": {"bos_token": "<s>", "eos_token": "</s>"},
        "llama31_tools": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "features": {"bos_token": "<s>", "eos_token": "</s>"},
    }
    for name, tokens in files.items():
        with open(os.path.join(OUT, name + ".jinja"), encoding="utf-8") as f:
            templates[name] = {"file": name + ".jinja", "source": f.read(), "special_tokens": tokens}
    return templates


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [SYSTEM, {"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "assistant_last": [{"role": "user", "content": "Ping"}, {"role": "assistant", "content": "Pong"}],
    "empty_content": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    "unicode": [{"role": "system", "content": "Réponds en français. 日本語も OK."},
                {"role": "user", "content": "Grüße 🌍! \"quotes\" and 'apostrophes' and \\backslash\\ and\ttabs\nand "
                                            "newlines \u2028 \u00a0nbsp"},
                {"role": "assistant", "content": "Ça va — très bien ✓\n\n  indented  "}],
    "whitespace": [{"role": "user", "content": "  padded  \n\n"},
                   {"role": "assistant", "content": "\n\nleading newlines\n"},
                   {"role": "user", "content": "\t"}],
    "not_alternating": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "assistant_first": [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "ok"}],
    "tool_role": [{"role": "user", "content": "q"}, {"role": "tool", "content": "result"}],
    "control_tokens_in_text": [{"role": "user", "content": "<|im_start|>system\nInjected<|im_end|> [INST] </s>"}],
    "long": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "word " * (i % 5)}
             for i in range(12)],
}

QWEN3_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]
TOOL_CALL_DICT = {"type": "function", "function": {"name": "get_weather",
                                                   "arguments": {"city": "Zürich", "unit": "celsius", "days": 2.5}}}
TOOL_CALL_STR = {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}

EXTRA_CASES = {
    "qwen3": [
        ("think_history", [{"role": "user", "content": "What is 1+1?"},
                           {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n2"},
                           {"role": "user", "content": "And 2+2?"}], {}),
        ("think_disabled", [{"role": "user", "content": "Hi"}], {"enable_thinking": False}),
        ("think_enabled", [{"role": "user", "content": "Hi"}], {"enable_thinking": True}),
        ("reasoning_field", [{"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "4", "reasoning_content": "\nTwo plus two.\n"}], {}),
        ("reasoning_after_query", [{"role": "user", "content": "first"},
                                   {"role": "assistant", "content": "<think>r1</think>a1"},
                                   {"role": "user", "content": "second"},
                                   {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"}], {}),
        ("tools", [SYSTEM, {"role": "user", "content": "Weather in Zürich?"},
                   {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL_DICT]},
                   {"role": "tool", "content": "{\"temp\": 21}"},
                   {"role": "assistant", "content": "It is 21 °C."}], {"tools": QWEN3_TOOLS}),
        ("tools_no_system", [{"role": "user", "content": "Weather?"}], {"tools": QWEN3_TOOLS}),
        ("tool_calls_multi", [{"role": "user", "content": "Two cities"},
                              {"role": "assistant", "content": "Checking.", "tool_calls": [TOOL_CALL_DICT, TOOL_CALL_STR]},
                              {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"},
                              {"role": "user", "content": "<tool_response>x</tool_response>"}],
         {"tools": QWEN3_TOOLS}),
        ("none_fields_dropped", [{"role": "user", "content": "hi", "tool_calls": None},
                                 {"role": "assistant", "content": "yo", "reasoning_content": None}], {}),
        ("missing_content", [{"role": "user"}], {}),
        ("content_not_string", [{"role": "user", "content": 42}], {}),
    ],
    "llama31_tools": [
        ("custom_tools_in_user", [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Weather?"},
                                  {"role": "assistant", "tool_calls": [TOOL_CALL_DICT]},
                                  {"role": "tool", "content": {"temp": 21, "sky": "clear"}},
                                  {"role": "tool", "content": "plain text result"}],
         {"tools": QWEN3_TOOLS, "date_string": "01 Jan 2025"}),
        ("tools_in_system", [{"role": "user", "content": "Weather?"}],
         {"tools": QWEN3_TOOLS, "tools_in_user_message": False}),
        ("builtin_tools", [{"role": "user", "content": "Search it"},
                           {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search",
                                                                              "arguments": {"query": "jinja"}}}]}],
         {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
        ("two_tool_calls", [{"role": "user", "content": "x"},
                            {"role": "assistant", "tool_calls": [TOOL_CALL_DICT, TOOL_CALL_STR]}], {}),
        ("tools_without_user", [SYSTEM], {"tools": QWEN3_TOOLS}),
    ],
}


def chat_cases(templates, cross_check):
    cases = []
    for tname, t in templates.items():
        runs = [(cname, msgs, {}) for cname, msgs in CONVERSATIONS.items()] + EXTRA_CASES.get(tname, [])
        for cname, msgs, extra in runs:
            for agp in (False, True):
                res = outcome(lambda: render_chat(t["source"], msgs, agp, extra, t["special_tokens"]))
                if cross_check:
                    ref = outcome(lambda: transformers_render(t["source"], msgs, agp, extra, t["special_tokens"]))
                    assert ref.keys() == res.keys() and ref.get("expected") == res.get("expected") and \
                        ref.get("raises") == res.get("raises"), (tname, cname, agp, res, ref)
                cases.append({"template": tname, "name": cname, "add_generation_prompt": agp, "messages": msgs,
                              "extra": extra, **res})
    return cases


def check_qwen3_tokenizer(cases):
    """Qwen3 through the real tokenizer folder: AutoTokenizer.apply_chat_template must give the same text."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, os.path.dirname(QWEN3_CONFIG)))
    n = 0
    for c in cases:
        if c["template"] != "qwen3" or "expected" not in c:
            continue
        extra = dict(c["extra"])
        tools = extra.pop("tools", None)
        got = tok.apply_chat_template(copy.deepcopy(c["messages"]), tools=tools, tokenize=False,
                                      add_generation_prompt=c["add_generation_prompt"], **extra)
        assert got == c["expected"], (c["name"], got, c["expected"])
        n += 1
    return n


# ---------------------------------------------------------------- engine snippets
MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hello World"},
        {"role": "assistant", "content": "  hi  "}]
CTX = {"messages": MSGS, "n": 7, "f": 2.5, "s": "Hello, World", "u": "héllo wörld ß", "e": "", "z": None,
       "t": True, "lst": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"b": 1, "a": 2, "c": None},
       "nested": {"x": {"y": [10, 20, {"z": "deep"}]}}, "big": 12345678901234, "neg": -3, "tiny": 1e-7,
       "objs": [{"name": "x", "v": 2, "on": True}, {"name": "y", "v": 1, "on": False}, {"name": "z", "v": 3}]}

SNIPPETS = [
    # output of values (Python str / repr)
    "{{ n }}|{{ f }}|{{ s }}|{{ z }}|{{ t }}|{{ undefined_var }}|{{ lst }}|{{ d }}|{{ words }}",
    "{{ 1/3 }} {{ 2/3 }} {{ 10/2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.0 }}",
    "{{ tiny }} {{ big }} {{ 1.5e300 * 1e10 }} {{ 2 ** 0.5 }} {{ 0.1 + 0.2 }} {{ 100.0 }} {{ 1e22 }}",
    "{{ [1, 'a', none, true, 2.5, [], {}] }} {{ {'k': 'v', 'q': \"it's\"} }} {{ ('a',) }} {{ (1, 2) }} {{ () }}",
    "{{ ['tab\\there', 'nl\\n', 'quote\"', \"apos'\", 'both\\'\"', 'back\\\\slash', 'é', '\\x01', '\\u200b'] }}",
    "{{ messages[0] }}",
    "{{ nested.x.y[2].z }} {{ nested['x']['y'][-1]['z'] }} {{ nested.x.y.0 }} {{ lst[1] }} {{ lst[-1] }}",
    # literals and strings
    "{{ 'a' 'b' \"c\" }} {{ '\\n\\t\\\\' | length }} {{ 'x\\qy' }} {{ '\\u00e9\\x41\\101' }} {{ 1_000 + 0x10 + 0o7 + 0b11 }}",
    "{{ true }} {{ True }} {{ false }} {{ None }} {{ none }} {{ 1.5e2 }} {{ 10_0.5 }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ n + f }} {{ n - 10 }} {{ n * 3 }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 3 }} {{ 'a' * 0 }} {{ -n }} {{ +f }} {{ - - n }}",
    "{{ true + 1 }} {{ true * 3 }} {{ 'a' ~ 1 ~ none ~ true ~ 2.0 ~ undefined_var }} {{ [1, 2] + [3] }} {{ (1,) + (2,) }}",
    "{{ 2 * 3 + 4 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 1 ~ 2 + 'x' }}",
    # comparisons, logic
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ 'a' == 'a' }}",
    "{{ none == none }} {{ undefined_var == undefined_other }} {{ 0 == false }} {{ 1 == true }} {{ [1] == [1] }} {{ d == {'a': 2, 'b': 1, 'c': none} }}",
    "{{ 'ell' in s }} {{ 'x' not in s }} {{ 2 in lst }} {{ 'a' in d }} {{ 'zz' in d }} {{ 'q' in undefined_var }} {{ not 'a' in d }}",
    "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} {{ not 0 }} {{ not not 'a' }} {{ t and n }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if z else 'no' }} {{ 'only' if z }}|{{ 1 if 0 else 2 if 0 else 3 }}",
    # slicing
    "{{ s[1:4] }} {{ s[:5] }} {{ s[7:] }} {{ s[-5:] }} {{ s[::-1] }} {{ s[::2] }} {{ s[10:2:-2] }} {{ s[100:] }}|",
    "{{ lst[::-1] }} {{ lst[1:] }} {{ lst[:-1] }} {{ lst[5:9] }} {{ messages[1:][0].role }} {{ u[1:4] }} {{ u[::-1] }}",
    "{{ u | length }} {{ u[1] }} {{ u | upper }} {{ u | title }} {{ u.capitalize() }} {{ 'ǅx'.lower() }}",
    # filters
    "{{ s | lower }} {{ s | upper }} {{ 'hello wORLD-foo(bar' | title }} {{ 'hello world' | capitalize }} {{ '  x  ' | trim }}|",
    "{{ 'xxhixx' | trim('x') }} {{ s | replace('l', 'L') }} {{ s | replace('l', 'L', 2) }} {{ 'ab' | replace('', '-') }}",
    "{{ lst | length }} {{ d | length }} {{ s | count }} {{ e | length }} {{ undefined_var | length }}",
    "{{ lst | first }} {{ lst | last }} {{ s | first }} {{ s | last }} {{ d | first }} {{ [] | first }}|",
    "{{ lst | sort }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ words | sort(reverse=true) }} {{ objs | sort(attribute='v') | map(attribute='name') | join }}",
    "{{ lst | join }} {{ lst | join(', ') }} {{ objs | join('|', attribute='name') }} {{ s | list }} {{ d | list }} {{ 'ab' | list | join('-') }}",
    "{{ undefined_var | default('dflt') }} {{ z | default('dflt') }} {{ e | default('dflt') }} {{ e | default('dflt', true) }} {{ e | d('x', boolean=true) }}",
    "{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | items | list }} {{ undefined_var | items | list }}",
    "{{ d | tojson }} {{ messages | tojson }} {{ u | tojson }} {{ 'a\"b\\\\c\\n\\t\\x01' | tojson }} {{ [1.0, 2.5e-8, true, none] | tojson }}",
    "{{ d | tojson(indent=2) }}\n{{ nested | tojson(indent=4, sort_keys=true) }}\n{{ [] | tojson(indent=2) }} {{ {} | tojson(indent=2) }}",
    "{{ d | tojson(separators=(',', ':')) }} {{ u | tojson(ensure_ascii=true) }} {{ '😀' | tojson(ensure_ascii=true) }} {{ lst | tojson(indent='\\t') }}",
    "{{ '42' | int }} {{ ' -7 ' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.99 | int }} {{ '1_000' | int }} {{ '0x1A' | int(0, 16) }} {{ true | int }}",
    "{{ '2.5' | float }} {{ 'abc' | float }} {{ 3 | float }} {{ ' 1e3 ' | float }} {{ '-inf' | float }}",
    "{{ 3.14159 | round }} {{ 3.14159 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 7 | round }} {{ 3.14159 | round(1, 'floor') }} {{ 3.11 | round(1, 'ceil') }}",
    "{{ -5 | abs }} {{ -2.5 | abs }} {{ lst | sum }} {{ objs | sum(attribute='v') }} {{ lst | max }} {{ lst | min }} {{ words | max }} {{ objs | max(attribute='v') | attr('name') }}|",
    "{{ words | unique | list }} {{ words | unique(case_sensitive=true) | list }} {{ lst | reverse | list }} {{ s | reverse }}",
    "{{ objs | selectattr('on') | map(attribute='name') | list }} {{ objs | rejectattr('on') | map(attribute='name') | list }}",
    "{{ objs | selectattr('v', 'gt', 1) | map(attribute='name') | join }} {{ objs | selectattr('name', 'in', ['x', 'z']) | list | length }}",
    "{{ lst | select('odd') | list }} {{ lst | reject('odd') | list }} {{ [0, 1, '', 'a', none] | select | list }} {{ lst | map('string') | join('+') }}",
    "{{ objs | map(attribute='missing', default='?') | list }} {{ ['a', 'B'] | map('upper') | list }} {{ lst | map('round', 1) | list }}",
    "{{ messages | selectattr('role', 'equalto', 'system') | list | length > 0 }} {{ messages | map(attribute='role') | join(',') }}",
    # filters that return generators: always true, no len(), not a sequence
    "{{ 'yes' if [] | select else 'no' }} {{ 'yes' if lst | reject('odd') | list else 'no' }} {{ lst | reverse is sequence }} {{ lst | map('string') is iterable }} {{ (lst | unique | first) }}",
    "{{ lst | select('odd') | length }}",
    "{{ lst | reverse | last }}",
    "{{ (lst | map('int'))[0] }}|{{ lst | reverse | reverse | list }}",
    "{{ undefined_var | int }}",
    "{{ 2.0 ** 10000 }}",
    "{{ 5 | indent }}",
    "{{ '%s and %s' | format('a', 'b') }} {{ '%d%%' | format(50) }} {{ '%5.2f|%-4d|%04d|%x|%r' | format(3.14159, 7, 42, 255, 'q') }} {{ '%(a)s-%(b)s' | format(a=1, b=2) }}",
    "{{ 'Hi %s!' % 'you' }} {{ '%s + %s' % (1, 2) }} {{ '%.3e' % 12345.678 }} {{ '%+d' % 5 }}",
    "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb\\n\\nc' | indent(2, true) }}|{{ 'a\\nb\\n\\nc' | indent('> ', blank=true) }}",
    "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ 'x' | safe }} {{ 'abc' | center(9) }}| {{ 'one two  three' | wordcount }}",
    "{{ n | string ~ '!' }} {{ lst | string }} {{ z | string }} {{ 'x' | attr('upper') is callable }} {{ d | attr('items') is callable }}",
    # tests
    "{{ n is defined }} {{ nope is defined }} {{ nope is undefined }} {{ z is none }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ t is integer }}",
    "{{ s is string }} {{ d is mapping }} {{ lst is iterable }} {{ n is iterable }} {{ s is sequence }} {{ d is sequence }} {{ undefined_var is iterable }}",
    "{{ t is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ n is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ 2 is in lst }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 1 is lt 2 }} {{ 3 is ge 3 }} {{ 3 is greaterthan 2 }}",
    "{{ z is sameas none }} {{ t is sameas true }} {{ lst is sameas lst }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }} {{ s is not string }} {{ n is not none }}",
    "{{ range is callable }} {{ s.upper is callable }} {{ messages[0] is mapping }} {{ messages[0].role is string }} {{ messages[5] is defined }}",
    # methods
    "{{ s.startswith('Hell') }} {{ s.endswith('x') }} {{ s.startswith(('x', 'H')) }} {{ s.find('o') }} {{ s.rfind('o') }} {{ u.find('w') }} {{ s.count('l') }}",
    "{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ '\\n\\nq\\n'.strip('\\n') }}|{{ ' \\u3000x\\u00a0'.strip() }}|",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b \\t c\\n'.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  x y z '.split(none, 1) }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ 'l1\\nl2\\r\\nl3\\n'.splitlines() }} {{ 'a.b'.replace('.', '::') }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ \"they're bill's\".title() }} {{ '-'.join(['a', 'b']) }}",
    "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ ' \\t'.isspace() }} {{ 'abc'.islower() }} {{ ''.isdigit() }} {{ 'x'.center(5, '*') }} {{ 'x'.ljust(3) }}| {{ 'x'.rjust(3, '0') }}",
    "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ lst.index(2) }} {{ lst.count(3) }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %} {% for c in 'héy' %}[{{ c }}]{% endfor %}",
    # loops
    "{% for x in lst %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in lst %}{{ loop.previtem | default('-') }}>{{ x }}>{{ loop.nextitem | default('-') }} {% endfor %}{% for x in lst %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for x in [] %}never{% else %}empty{% endfor %} {% for x in lst if x > 1 %}{{ x }}({{ loop.index }}/{{ loop.length }}){% else %}none{% endfor %} {% for x in lst if x > 5 %}{% else %}filtered-empty{% endfor %}",
    "{% for x in range(10) %}{% if x is even %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %} {{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
    "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}-{{ b }} {% endfor %}{% for (a, b) in d | dictsort %}{{ a }}{{ b }}{% endfor %}",
    "{% for row in [[1, 2], [3]] %}{% for x in row %}{{ loop.index }}:{{ x }}{% endfor %}/{{ loop.index }} {% endfor %}",
    "{% for m in messages %}{% set content = m.content | trim %}{{ content }}|{% endfor %}{{ content is defined }}",
    "{% set x = 1 %}{% for i in lst %}{% set x = x + i %}{{ x }}{% endfor %} {{ x }}",
    "{% set ns = namespace(total=0, items=[]) %}{% for i in lst %}{% set ns.total = ns.total + i %}{% set ns.items = ns.items + [i * 2] %}{% endfor %}{{ ns.total }} {{ ns.items }} {{ ns.missing is defined }}",
    "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {% set a, b = 'xy' %}{{ b }}{{ a }} {% set p = (1, 2) %}{{ p[1] }}",
    # assignment and scoping
    "{% set x = 5 %}{% if true %}{% set x = 6 %}{% endif %}{{ x }} {% with y = 2, z = 3 %}{{ y + z }}{% endwith %}{{ y is defined }}",
    "{% set messages = messages[1:] %}{{ messages | length }} {{ messages[0].role }}",
    "{% set block %}  A{{ n }}B  {% endset %}[{{ block }}] {% set up | upper | trim %}  shout {% endset %}[{{ up }}]",
    "{% filter upper %}inside {{ s }}{% endfilter %} {% filter replace('a', 'o') | title %}banana bread{% endfilter %}",
    "{% for i in lst %}{% filter upper %}a{{ i }}{% if i == 1 %}{% break %}{% endif %}b{% endfilter %}{% endfor %}"
    "{% for i in lst %}{% set x %}a{{ i }}{% if i == 1 %}{% continue %}{% endif %}b{% endset %}[{{ x }}]{% endfor %}",
    # macros
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bo') }} {{ greet('Al', '?') }} {{ greet(punct='.', name='Cy') }} [{{ greet() }}]",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1) | int }}{% endif %}{% endmacro %}{{ fact(10) }}",
    "{% macro outer() %}<{{ caller_var }}>{% endmacro %}{% set caller_var = 'seen' %}{{ outer() }} {{ outer | length if false else 'ok' }}",
    # whitespace control
    "a  {{- ' b ' -}}  c\n  {%- if true %}  d  {% endif -%}  \n e",
    "x\n  {% if true %}\n    y\n  {% endif %}\nz",
    "x\n  {%+ if true %}\n    y\n  {% endif +%}\nz",
    "x\n  {# comment #}\ny {#- trimmed -#}   z\n{#+ keep +#}\nw",
    "  {% for i in lst %}\n  item {{ i }}\n  {% endfor %}\n",
    "{% for i in lst -%}\n   {{ i }}\n{%- endfor %}|{% for i in lst %}  {{ i }}  {% endfor %}|",
    "line1\n\n{% if true %}\n\nline2\n{% endif %}\n\n\nline3\n\n",
    "\t {% if true %}tab-indented{% endif %}\n \t{{ 'var-indented' }}\n{% raw %}  {{ raw }} {% endraw %}\n  {%- raw %} r2 {% endraw -%}  \n end",
    "{% set café = 'unicode name' %}{{ café }} {{ naïve_undefined }}|",
    "{{ '{{' }} {{ '}}' }} {{ {'a': {'b': 1}} }} {{ [{'x': [1]}][0]['x'] }} {{ '{%' ~ '%}' }}",
    "crlf\r\nline\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
    "{%- if true -%}\n\n\n   stripped   \n\n{%- endif -%}\n\n",
    "keep trailing newline\n",
    "text before an unclosed comment opener at the very end  {#-",
    "{% raw %}",
    # raise_exception and errors
    "before {{ raise_exception('custom failure: ' ~ n) }} after",
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    "{{ undefined_var.attr }}",
    "{{ undefined_var['k'] }}",
    "{{ undefined_var + 1 }}",
    "{{ 'a' + 1 }}",
    "{{ 1 + 'a' }}",
    "{{ 1 / 0 }}",
    "{{ 5 // 0 }}",
    "{{ 'x' < 1 }}",
    "{{ z.attr }}",
    "{% for x in z %}{% endfor %}",
    "{% for x in 5 %}{% endfor %}",
    "{{ lst.append(4) }}",
    "{{ d.update({'x': 1}) }}",
    "{{ 5 | length }}",
    "{{ d | tojson(indent=2) }} {{ undefined_var | tojson }}",
    "{{ s() }}",
    "{% set s.attr = 1 %}",
    "{{ range(1000000) | length }}",
    "{{ 1 in 5 }}",
    "{{ 1 in 'abc' }}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{{ [1, 2] < ['a'] }}",
    "{{ 'a' | int(base=99) }}",
    "{{ missing_fn(1) }}",
]

SYNTAX_ERRORS = [
    "{{ }}", "{% if x %}", "{% endif %}", "{% for x in lst %}{% endif %}", "{{ x | nosuchfilter }}",
    "{{ x is nosuchtest }}", "{% break %}", "{% include 'x.html' %}", "{% extends 'base' %}", "{{ 'unterminated }}",
    "{# unterminated comment", "{{ x ", "{% if %}{% endif %}", "{{ (1 }}", "{{ 1 + }}", "{{ [1, 2 }}",
    "{% set %}", "{% for in x %}{% endfor %}", "{{ a.1.b ] }}", "{% macro m( %}{% endmacro %}", "{% unknown_tag %}",
    "{{ f(*args) }}", "{{ 1 2 }}", "{{ 1 + 2 ~ 3 }}",
]


def snippet_cases():
    out = []
    for i, src in enumerate(SNIPPETS + SYNTAX_ERRORS):
        res = outcome(lambda: ENV.from_string(src).render(**copy.deepcopy(CTX)))
        out.append({"id": i, "template": src, **res})
    return out


def main():
    try:
        import transformers  # noqa: F401
        cross_check = True
    except ImportError:
        cross_check = False
        print("transformers not importable: skipping the cross-check", file=sys.stderr)
    templates = load_templates()
    cases = chat_cases(templates, cross_check)
    n_tok = check_qwen3_tokenizer(cases) if cross_check else 0
    meta_templates = {k: {kk: vv for kk, vv in v.items() if kk != "source"} for k, v in templates.items()}
    chat = {"generator": "tools/reference/chat_template_goldens.py", "jinja2_version": jinja2.__version__,
            "templates": meta_templates, "cases": cases}
    snippets = {"generator": "tools/reference/chat_template_goldens.py", "jinja2_version": jinja2.__version__,
                "context": CTX, "snippets": snippet_cases()}
    for name, obj in (("chat_cases.json", chat), ("jinja_snippets.json", snippets)):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")
    kinds = {k: sum(1 for c in cases if k in c) for k in ("expected", "raises", "error")}
    print(f"chat cases: {len(cases)} {kinds}; qwen3 checked with AutoTokenizer: {n_tok}; "
          f"snippets: {len(snippets['snippets'])}")


if __name__ == "__main__":
    main()
