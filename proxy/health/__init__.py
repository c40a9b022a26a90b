"""Probes answered by a small process of its own (``--health-listen``), from what the event
loop answers its questions, so ``/healthz`` answers in milliseconds while the proxy's
interpreter is held by a huge parse or the first scan."""
