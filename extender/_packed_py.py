"""The pure-Python twin of the compiled ``extender._packed``: same functions, same answers.

Used where the extension was not built (no C compiler at install time); the tests run both on
the same cases. See ``extender/_packed.c`` for what "plain" means and why this exists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import compress, repeat

import numpy as np
import numpy.typing as npt

__all__ = ["NameTable", "count_codes", "render", "render_scores", "render_sections", "scan"]

# "a","b",...: every name printable ASCII without '"' or '\'; or nothing at all.
_PLAIN = re.compile(rb'(?:"[\x20\x21\x23-\x5b\x5d-\x7e]*"(?:,"[\x20\x21\x23-\x5b\x5d-\x7e]*")*)?')


def scan(buf: bytes, start: int, end: int, /) -> bytearray | None:
    if start < 0 or end < start or end > len(buf):
        raise ValueError("span outside the buffer")
    span = buf[start:end]
    if _PLAIN.fullmatch(span) is None:
        return None
    lengths = [len(name) for name in span[1:-1].split(b'","')] if span else []
    pairs = np.zeros((len(lengths), 2), dtype=np.int32)
    if lengths:
        pairs[:, 1] = lengths
        # Each name starts 3 bytes ('","') after the end of the one before.
        pairs[1:, 0] = np.cumsum(pairs[:-1, 1] + 3)
        pairs[:, 0] += start + 1
    return bytearray(pairs.tobytes())


def _names(buf: bytes, pairs: bytes | bytearray) -> list[bytes]:
    if len(pairs) % 8:
        raise ValueError("name pairs outside the buffer")
    table = np.frombuffer(pairs, dtype=np.int32).reshape(-1, 2).tolist()
    if any(o < 0 or n < 0 or o + n > len(buf) for o, n in table):
        raise ValueError("name pairs outside the buffer")
    return [buf[o : o + n] for o, n in table]


class NameTable:
    def __init__(self, names: Sequence[str | None]) -> None:
        self._slots: dict[bytes, int] = {}
        for slot, name in enumerate(names):
            if name is None or slot == 0:  # slot 0 is the sentinel, never a name
                continue
            key = name.encode()
            if key in self._slots:
                raise ValueError(f"node name {name!r} appears twice")
            self._slots[key] = slot

    def __len__(self) -> int:
        return len(self._slots)

    def resolve(self, buf: bytes, pairs: bytes | bytearray, /) -> bytearray:
        names = _names(buf, pairs)
        ids = np.fromiter(map(self._slots.get, names, repeat(0)), dtype=np.int32, count=len(names))
        return bytearray(ids.tobytes())


def render(  # noqa: PLR0917 - the C function's positional signature
    buf: bytes,
    pairs: bytes | bytearray,
    codes: npt.NDArray[np.int8],
    code: int,
    suffix: bytes,
    sep: bytes,
    /,
) -> bytes:
    names = _names(buf, pairs)
    if len(codes) != len(names):
        raise ValueError("codes must hold exactly one int8 per name")
    chosen = compress(names, (codes == code).tolist())
    return sep.join(b'"' + name + b'"' + suffix for name in chosen)


def render_scores(buf: bytes, pairs: bytes | bytearray, scores: npt.NDArray[np.int64], /) -> bytes:
    names = _names(buf, pairs)
    if len(scores) != len(names):
        raise ValueError("scores must hold exactly one int64 per name")
    return b",".join(
        b'{"Host":"' + name + b'","Score":' + str(score).encode() + b"}"
        for name, score in zip(names, scores.tolist(), strict=True)
        if score
    )


def render_sections(
    buf: bytes,
    pairs: bytes | bytearray,
    codes: npt.NDArray[np.int8],
    placements: Sequence[tuple[int, bytes] | None],
    texts: Sequence[bytes],
    /,
) -> bytes:
    names = _names(buf, pairs)
    if len(placements) > 128 or not 1 <= len(texts) <= 9:
        raise ValueError("at most 128 codes, and 1 to 9 texts")
    for placement in placements:
        if placement is not None and not 0 <= placement[0] < len(texts) - 1:
            raise ValueError("a placement names a section out of range")
    if len(codes) != len(names):
        raise ValueError("codes must hold exactly one int8 per name")
    sections: list[list[bytes]] = [[] for _ in texts[1:]]
    for name, code in zip(names, codes.tolist(), strict=True):
        placement = placements[code] if 0 <= code < len(placements) else None
        if placement is not None:
            section, suffix = placement
            sections[section].append(b'"' + name + b'"' + suffix)
    parts = [texts[0]]
    for section, text in zip(sections, texts[1:], strict=True):
        parts += [b",".join(section), text]
    return b"".join(parts)


def count_codes(codes: npt.NDArray[np.int8], size: int, /) -> list[int]:
    if not 0 <= size <= 128:
        raise ValueError("size must be 0..128")
    values = np.asarray(codes, dtype=np.int8)
    if len(values) and (int(values.min()) < 0 or int(values.max()) >= size):
        raise ValueError("a code outside 0..size-1")
    counts: list[int] = np.bincount(values, minlength=size).tolist()
    return counts
