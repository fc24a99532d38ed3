"""Node names kept as the bytes kube-scheduler sent, never turned into Python strings.

filter and prioritize get up to thousands of node names per call (5,000 with
``percentageOfNodesToScore: 100``), in an order that changes every cycle. Decoding them into
strings, hashing each one to find its inventory slot and joining them back into the answer was
most of a filter call. :class:`PackedNames` is instead a span of the request body in "plain"
form (``"a","b",...``, every name printable ASCII with nothing to escape, as Go writes every
valid node name): the inventory resolves it to slots with one call of a table built once per
layout, and the answer is written from the same bytes. Both classes are still
``Sequence[str]``, materialised on first use, so code that needs the names as strings (gangs,
explanations, preemption waits) works unchanged.

The work is done by the compiled ``extender._packed`` when it was built (a C compiler at
install time), else by its pure-Python twin: same answers, slower.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from itertools import compress
from typing import overload

import numpy as np
import numpy.typing as npt

try:
    from extender._packed import (
        NameTable,
        count_codes,
        render,
        render_scores,
        render_sections,
        scan,
    )

    NATIVE = True
except ImportError:  # installed without a C compiler: same answers, slower
    from extender._packed_py import (  # type: ignore[assignment]
        NameTable,
        count_codes,
        render,
        render_scores,
        render_sections,
        scan,
    )

    NATIVE = False

__all__ = ["NATIVE", "NameTable", "NameView", "NodeSubset", "PackedNames", "count_codes"]

CodeArray = npt.NDArray[np.int8]


class NameView(Sequence[str]):
    """What both classes share: a lazily materialised list, and equality by content."""

    __slots__ = ("_list",)

    def __init__(self) -> None:
        self._list: list[str] | None = None

    @abstractmethod
    def _materialise(self) -> list[str]:
        """The names as strings (built once, on first use)."""

    @abstractmethod
    def plain(self) -> bytes:
        """The names in plain form, as they would appear inside a JSON array."""

    @abstractmethod
    def render(self, suffix: bytes, sep: bytes) -> bytes:
        """``'"name"' + suffix`` for every name, joined by ``sep``."""

    def names(self) -> list[str]:
        if self._list is None:
            self._list = self._materialise()
        return self._list

    def pick(self, indices: npt.NDArray[np.intp]) -> list[str]:
        """The names at ``indices``, in that order."""
        names = self.names()
        return [names[i] for i in indices.tolist()]

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self.names()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NameView):
            return self.plain() == other.plain()
        if isinstance(other, list | tuple):
            return self.names() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable cache, equality by content

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} names)"


class PackedNames(NameView):
    """``body[start:end]``: node names in plain form, without the brackets; ``pairs`` is
    where each name is in ``body`` (what :func:`scan` found)."""

    __slots__ = ("_body", "_count", "_end", "_pairs", "_start")

    def __init__(self, body: bytes, start: int, end: int, pairs: bytearray) -> None:
        super().__init__()
        self._body, self._start, self._end, self._pairs = body, start, end, pairs
        self._count = len(pairs) // 8

    @classmethod
    def parse(cls, body: bytes, start: int, end: int) -> PackedNames | None:
        """The names of ``body[start:end]``, or None if they are not in plain form."""
        pairs = scan(body, start, end)
        return None if pairs is None else cls(body, start, end, pairs)

    @classmethod
    def of(cls, names: Sequence[str]) -> PackedNames | None:
        """Pack names given as strings (tests and benchmarks); None if one is not plain."""
        try:
            body = b",".join(b'"' + name.encode("ascii") + b'"' for name in names)
        except UnicodeEncodeError:
            return None
        return cls.parse(body, 0, len(body))

    def __len__(self) -> int:
        return self._count

    def plain(self) -> bytes:
        return self._body[self._start : self._end]

    def slots(self, table: NameTable) -> npt.NDArray[np.int32]:
        """The inventory slot of every name (0: a name ``table`` does not hold)."""
        return np.frombuffer(table.resolve(self._body, self._pairs), dtype=np.int32)

    def subset(self, codes: CodeArray, code: int, count: int) -> NodeSubset:
        return NodeSubset(self, codes, code, count)

    def render(self, suffix: bytes, sep: bytes) -> bytes:
        return self.render_where(np.zeros(self._count, dtype=np.int8), 0, suffix, sep)

    def render_where(self, codes: CodeArray, code: int, suffix: bytes, sep: bytes) -> bytes:
        """``'"name"' + suffix`` for every name whose code is ``code``, joined by ``sep``."""
        return render(self._body, self._pairs, codes, code, suffix, sep)

    def render_sections(
        self,
        codes: CodeArray,
        placements: Sequence[tuple[int, bytes] | None],
        texts: Sequence[bytes],
    ) -> bytes:
        """A whole answer, in one buffer: ``texts`` with the sections between them, each
        section the names (``","`` between them) whose code is placed there:
        ``placements[code]`` is ``(section, suffix)``, or None for names left out."""
        return render_sections(self._body, self._pairs, codes, placements, texts)

    def pick(self, indices: npt.NDArray[np.intp]) -> list[str]:
        """The names at ``indices`` without decoding the others (a shortlist of a few out of
        thousands)."""
        if self._list is not None:
            return super().pick(indices)
        table = np.frombuffer(self._pairs, dtype=np.int32).reshape(-1, 2)[indices].tolist()
        body = self._body
        return [body[at : at + size].decode("ascii") for at, size in table]

    def render_scores(self, scores: npt.NDArray[np.int64]) -> bytes:
        """The inside of prioritize's answer: ``{"Host":"name","Score":s}`` per name whose
        score is not 0 (kube-scheduler adds nothing for a host an extender does not list)."""
        values = np.ascontiguousarray(scores, dtype=np.int64)
        return render_scores(self._body, self._pairs, values)

    def _materialise(self) -> list[str]:
        if not self._count:
            return []
        return self._body[self._start + 1 : self._end - 1].decode("ascii").split('","')


class NodeSubset(NameView):
    """The names of ``names`` whose code is ``code`` (one code per name), in their order."""

    __slots__ = ("_code", "_codes", "_count", "_names", "_plain")

    def __init__(self, names: PackedNames, codes: CodeArray, code: int, count: int) -> None:
        super().__init__()
        self._names, self._codes, self._code, self._count = names, codes, code, count
        self._plain: bytes | None = None

    def __len__(self) -> int:
        return self._count

    @property
    def source(self) -> tuple[PackedNames, CodeArray]:
        """The packed names and the codes this subset was cut from (one per name)."""
        return self._names, self._codes

    def code(self) -> int:
        return self._code

    def plain(self) -> bytes:
        if self._plain is None:
            self._plain = self.render(b"", b",")
        return self._plain

    def render(self, suffix: bytes, sep: bytes) -> bytes:
        return self._names.render_where(self._codes, self._code, suffix, sep)

    def pick(self, indices: npt.NDArray[np.intp]) -> list[str]:
        if self._list is not None:
            return super().pick(indices)
        return self._names.pick(np.flatnonzero(self._codes == self._code)[indices])

    def _materialise(self) -> list[str]:
        return list(compress(self._names.names(), (self._codes == self._code).tolist()))
