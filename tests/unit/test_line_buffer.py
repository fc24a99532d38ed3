"""The watch stream's line splitting (app.kube.watch_stream.LineBuffer): whole lines however
the reads cut them, blank lines dropped, the unfinished rest, and the bound on a line."""

from __future__ import annotations

import pytest

from app.kube.watch_stream import LineBuffer

CASES = [
    # (reads, lines handed out after each read, rest at the end)
    ([b'{"a":1}\n'], [[b'{"a":1}']], b""),
    ([b'{"a"', b':1}\n{"b"', b":2}\n"], [[], [b'{"a":1}'], [b'{"b":2}']], b""),
    ([b"x\ny\nz"], [[b"x", b"y"]], b"z"),
    ([b"\n\n  \nx\n"], [[b"x"]], b""),
    ([b"x", b"y", b"z"], [[], [], []], b"xyz"),
    ([b"  "], [[]], b""),  # only blanks left over: nothing
    ([b"ab", b"c\n", b"d\ne", b"f"], [[], [b"abc"], [b"d"], []], b"ef"),
]


@pytest.mark.parametrize(("reads", "lines", "rest"), CASES)
def test_whole_lines_however_the_reads_cut_them(
    reads: list[bytes], lines: list[list[bytes]], rest: bytes
) -> None:
    buffer = LineBuffer()
    assert [buffer.feed(read) for read in reads] == lines
    assert buffer.rest() == rest
    assert buffer.rest() == b""  # taken once


@pytest.mark.parametrize(
    "reads",
    [[b"x" * 11], [b"x" * 6, b"x" * 6], [b"ok\n" + b"x" * 11]],
    ids=["one-read", "two-reads", "after-a-line"],
)
def test_an_unfinished_line_over_the_bound_is_refused(reads: list[bytes]) -> None:
    buffer = LineBuffer(limit=10)
    *before, last = reads
    for read in before:
        buffer.feed(read)
    with pytest.raises(ValueError, match="a line over 10 bytes"):
        buffer.feed(last)


def test_a_line_at_the_bound_is_kept_and_the_count_starts_again_after_it() -> None:
    buffer = LineBuffer(limit=10)
    assert buffer.feed(b"x" * 10) == []
    assert buffer.feed(b"\n" + b"y" * 10) == [b"x" * 10]
    assert buffer.feed(b"\n") == [b"y" * 10]
