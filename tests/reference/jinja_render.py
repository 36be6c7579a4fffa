#!/usr/bin/env python3
"""Renders chat templates the way Hugging Face transformers does (the
reference for kiln's Jinja subset, tests/test_jinja.c).

stdin: a JSON list of {"template": str, "vars": object}; stdout: a JSON list
of {"ok": true, "text": str} or {"ok": false, "error": str}, one per job.
The environment is transformers' _compile_jinja_template: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension, raise_exception and strftime_now globals, and its
tojson filter (json.dumps without HTML escaping)."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    # transformers' AssistantTracker without the span bookkeeping: the body
    # renders unchanged.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

out = []
for job in json.load(sys.stdin):
    try:
        out.append({"ok": True, "text": env.from_string(job["template"]).render(**job["vars"])})
    except Exception as e:  # noqa: BLE001 - every failure is reported to the C side
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout, ensure_ascii=False)
