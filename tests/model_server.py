"""The real model server of tests/model: llama.cpp with SmolLM2-135M, both from PyPI (the
launcher is ``proxy.localmodel``, which ``tailfloor demo`` starts too)::

    python tests/model_server.py --port 18090 --n-ctx 2048
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.localmodel import MODEL_FILE, main, model_path

__all__ = ["MODEL_FILE", "main", "model_path"]

if __name__ == "__main__":
    main()
