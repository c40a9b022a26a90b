"""An https upstream: TLS with certificate verification against a given CA file."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyProcess

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture(scope="module")
def tls_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def chat(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "tls": request.secure,
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                            "total_tokens": 2}})

    app = web.Application()
    app.router.add_post("/api/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"https://localhost:{port}/api/v1", cert
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def post(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url + "/v1/chat/completions", data=CHAT)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_https_upstream_with_its_ca(tls_upstream: tuple[str, Path]) -> None:
    url, cert = tls_upstream
    process = ProxyProcess(url, "--upstream-ca", str(cert))
    try:
        status, body = post(process.url)
        assert status == 200
        answer = orjson.loads(body)
        assert answer["path"] == "/api/v1/chat/completions" and answer["tls"] is True
    finally:
        process.stop()


def test_https_upstream_with_an_untrusted_certificate_is_502(
        tls_upstream: tuple[str, Path]) -> None:
    url, _ = tls_upstream
    process = ProxyProcess(url)
    try:
        status, body = post(process.url)
        assert status == 502
        assert b"upstream_unavailable" in body and b"certificate" in body.lower()
    finally:
        process.stop()
