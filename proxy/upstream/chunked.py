"""Decoding a chunked HTTP/1.1 body as its pieces arrive (pure: bytes in, bytes out)."""

from __future__ import annotations

MAX_LINE = 64 * 1024


class ChunkedError(Exception):
    """The body is not valid chunked coding."""


def chunk_size(line: bytes) -> int:
    """A chunk-size line's size (its extensions ignored)."""
    cut = line.find(b";")
    if cut >= 0:
        line = line[:cut]
    try:
        return int(line.strip(), 16)
    except ValueError as exc:
        raise ChunkedError(f"bad chunk size {line.strip()[:20]!r}") from exc


def _expect_crlf(data: bytes, at: int) -> None:
    if data[at:at + 2] != b"\r\n":
        raise ChunkedError("chunk not followed by CRLF")


class ChunkedDecoder:
    """The state between two pieces: where in a chunk the last piece ended."""

    __slots__ = ("_held", "_remaining", "_state", "ended", "extra")

    def __init__(self) -> None:
        self._held = b""  # an incomplete size line, CRLF or trailer line
        self._state = "size"  # "size" | "data" | "crlf" | "trailer"
        self._remaining = 0  # bytes left of the current chunk
        self.ended = False
        self.extra = False  # bytes came after the body's end

    def feed(self, data: bytes) -> bytes:
        """The body bytes in ``data`` (b"" when none is complete yet)."""
        if not self._held and self._state == "size":
            # A piece that is exactly one whole chunk (how a streaming upstream writes each
            # event): its data in one slice, without the general walk below.
            # (Plain comparisons and slices: a bytes method taking a needle costs more here
            # than the rest of the step.)
            line_end = data.find(b"\r\n")
            if line_end > 0:
                try:
                    size = int(data[:line_end], 16)
                except ValueError:
                    size = 0  # an extension or a bad size: the general walk below
                end = line_end + 2 + size
                if size > 0 and end + 2 == len(data) and data[-2:] == b"\r\n":
                    return data[line_end + 2:end]
        return self._walk(data)

    def _walk(self, data: bytes) -> bytes:
        # Work on one bytes object with an offset: a piece is sliced once, never shifted. A
        # chunk whose size line, data and CRLF all arrived (one SSE event, most of the time)
        # is taken in one step.
        if self._held:
            data, self._held = self._held + data, b""
        pos, size_of, out = 0, len(data), []
        state, remaining = self._state, self._remaining
        try:
            while pos < size_of:
                if state == "size":
                    line_end = data.find(b"\r\n", pos)
                    if line_end < 0:
                        break
                    remaining = chunk_size(data[pos:line_end])
                    pos = line_end + 2
                    if not remaining:
                        state = "trailer"
                        continue
                    end = pos + remaining
                    if end + 2 <= size_of:
                        _expect_crlf(data, end)
                        out.append(data[pos:end])
                        pos, remaining = end + 2, 0
                        continue
                    state = "data"
                elif state == "data":
                    take = min(remaining, size_of - pos)
                    out.append(data[pos:pos + take])
                    pos += take
                    remaining -= take
                    if not remaining:
                        state = "crlf"
                elif state == "crlf":
                    if size_of - pos < 2:
                        break
                    _expect_crlf(data, pos)
                    pos += 2
                    state = "size"
                else:  # trailer section: lines until an empty one
                    line_end = data.find(b"\r\n", pos)
                    if line_end < 0:
                        break
                    empty = line_end == pos
                    pos = line_end + 2
                    if empty:
                        self.ended, self.extra = True, pos < size_of
                        return b"".join(out)
        finally:
            self._state, self._remaining = state, remaining
        if pos < size_of:
            self._hold(data[pos:])
        return out[0] if len(out) == 1 else b"".join(out)

    def _hold(self, rest: bytes) -> None:
        """Keep a piece's incomplete end for the next piece, within bounds."""
        if len(rest) > MAX_LINE and self._state != "data":
            raise ChunkedError("chunk header line over 64 KiB")
        self._held = rest
