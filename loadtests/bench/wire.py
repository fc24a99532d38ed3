"""One verb request over a kept-alive connection, sent as kube-scheduler's Go client writes
it, and timed: the round trip, and where schedext's timing headers put its parts."""

from __future__ import annotations

import http.client
import time


def post(conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int = 0) -> bytes:
    """POST ``body`` and read the answer. ``write_size``: send the request in writes of that
    many bytes, the head with the body's first bytes, as Go's HTTP client (kube-scheduler's)
    writes through its 4 KiB buffer; 0: all in one write."""
    return _exchange(conn, path, body, write_size)[0]


def _exchange(
    conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int = 0
) -> tuple[bytes, http.client.HTTPResponse]:
    """:func:`post`, with the response (its headers) too."""
    if not write_size:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    else:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        head = len(b"\r\n".join(conn._buffer)) + 4  # type: ignore[attr-defined]
        first = max(0, write_size - head)
        conn.endheaders(message_body=body[:first])
        for start in range(first, len(body), write_size):
            conn.send(body[start : start + write_size])
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path} answered {response.status}: {data[:200]!r}")
    return data, response


Split = tuple[float, float, float]  # µs: before the server read it, in the server, after


def timed(
    conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int
) -> tuple[bytes, float, Split | None]:
    """The answer, the round trip (ms), and where the server's timing headers (schedext with
    the benchmark endpoints: app.service.routes.verbs.timing_headers) put its parts. Both sides read
    the same monotonic clock."""
    sent = time.perf_counter()
    data, response = _exchange(conn, path, body, write_size)
    received = time.perf_counter()
    read = response.getheader("x-schedext-read")
    answered = response.getheader("x-schedext-answered")
    split = None
    if read is not None and answered is not None:
        at_read, at_answer = float(read), float(answered)
        split = ((at_read - sent) * 1e6, (at_answer - at_read) * 1e6, (received - at_answer) * 1e6)
    return data, (received - sent) * 1000, split
