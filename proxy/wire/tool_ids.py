"""Tool-call ids in every form the agents put on the wire, and the one key they share. Pure.

The same call travels under several spellings:

- verbatim, as the model made it (``call_0efe83d3d93349ad``, ``toolu_01...``, ``fc_...``);
- Pi's replay form for another model: the part before ``|``, characters other than letters,
  digits, ``_`` and ``-`` replaced by ``_``, at most 40 characters;
- OpenClaw's form: letters and digits only (``callab12``);
- OpenClaw's form of Pi's form.

``call_id_key`` maps all of them to one key: the first 32 letters and digits of the part
before ``|``. The forms agree on it whenever the id's first 40 characters hold at least 32
letters and digits, or the id is at most 40 characters long (every id seen from OpenAI,
Anthropic, Gemini, Pi and OpenClaw); tests/wire/test_tool_ids.py checks this property.
"""

from __future__ import annotations

import re

__all__ = ["KEY_CHARS", "call_id_key", "openclaw_form", "pi_form", "wire_forms"]

KEY_CHARS = 32
PI_MAX = 40
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")
_PI_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def call_id_key(call_id: object) -> str:
    """The key every wire form of a tool-call id shares ("" for no id)."""
    if not isinstance(call_id, str):
        return ""
    return _NOT_ALNUM.sub("", call_id.split("|", 1)[0])[:KEY_CHARS]


def pi_form(call_id: str) -> str:
    """Pi's replay form (part before ``|``, unsafe characters -> ``_``, 40 at most)."""
    return _PI_UNSAFE.sub("_", call_id.split("|", 1)[0])[:PI_MAX]


def openclaw_form(call_id: str) -> str:
    """OpenClaw's wire form: letters and digits only."""
    return _NOT_ALNUM.sub("", call_id)


def wire_forms(call_id: str) -> tuple[str, ...]:
    """Every form an agent may send, verbatim first, without repeats."""
    pi = pi_form(call_id)
    forms = dict.fromkeys((call_id, pi, call_id.replace("_", ""), pi.replace("_", ""),
                           openclaw_form(call_id), openclaw_form(pi)))
    return tuple(f for f in forms if f)
