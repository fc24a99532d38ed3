"""The waits book on its own (extender.capacity_waits): which of the pods waiting for what
was freed are due a nudge, in what order, how many per freeing, and how often per pod."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import pytest

from extender.capacity_waits import Nudge, Wait, WaitBook, WaitKind

GPU, SHARE, MIG, ADDRESS = WaitKind.GPU, WaitKind.SHARE, WaitKind.MIG, WaitKind.ADDRESS
H100: Wait = (GPU, "H100")
A100: Wait = (GPU, "A100")
SHARE_H100: Wait = (SHARE, "H100")
SMALL: Wait = (MIG, "1g.10gb")
POOL: Wait = (ADDRESS, "rack-a")


@dataclass
class Story:
    """What happens to a book, step by step; :meth:`nudged` plays it and says whom each
    take sent back. ``Story(per_event=2).wait("a", H100).freed(GPU, "H100").take(0)``."""

    per_event: int = 2
    interval_s: float = 1.0
    capacity: int = 100
    steps: list[Callable[[WaitBook], object]] = field(default_factory=list)

    def wait(self, uid: str, *on: Wait) -> Self:
        self.steps.append(lambda book: book.wait(uid, f"ns/{uid}", on))
        return self

    def waits(self, *uids: str, on: Wait = H100) -> Self:
        for uid in uids:
            self.wait(uid, on)
        return self

    def freed(self, kind: WaitKind, key: str | None = None, count: int = 1) -> Self:
        self.steps.append(lambda book: book.freed(kind, key, count))
        return self

    def forget(self, uid: str) -> Self:
        self.steps.append(lambda book: book.forget(uid))
        return self

    def take(self, now: float) -> Self:
        self.steps.append(lambda book: book.take(now))
        return self

    def book(self) -> WaitBook:
        return WaitBook(
            per_event=self.per_event, interval_s=self.interval_s, capacity=self.capacity
        )

    def nudged(self) -> list[list[str]]:
        """Per take, the uids it sent back, in order."""
        book, sent = self.book(), []
        for step in self.steps:
            result = step(book)
            if isinstance(result, list):
                sent.append([nudge.uid for nudge in result])
        return sent


CASES: list[tuple[str, Story, list[list[str]]]] = [
    ("a freeing nudges the pods waiting for its key",
     Story().wait("a", H100).wait("b", A100).freed(GPU, "H100").take(0), [["a"]]),
    ("nothing freed: no nudge", Story().waits("a", "b").take(0), [[]]),
    ("the longest waiting first, per_event of them",
     Story().waits("a", "b", "c").freed(GPU, "H100").take(0), [["a", "b"]]),
    ("each freeing counts: two freed, twice per_event",
     Story().waits("a", "b", "c", "d", "e").freed(GPU, "H100", count=2).take(0),
     [["a", "b", "c", "d"]]),
    ("two freeings of one key before a take: as many as one freeing of two",
     Story().waits("a", "b", "c").freed(GPU, "H100").freed(GPU, "H100").take(0),
     [["a", "b", "c"]]),
    ("a pod waiting on two keys freed together is nudged once",
     Story().wait("a", H100, SHARE_H100).freed(GPU, "H100").freed(SHARE, "H100").take(0),
     [["a"]]),
    ("the same key of another kind frees nothing",
     Story().wait("a", SHARE_H100).freed(GPU, "H100").take(0), [[]]),
    ("a freeing before the pod waited wakes nothing",
     Story().freed(GPU, "H100").wait("a", H100).take(0), [[]]),
    ("a pod turned away again keeps its place in line",
     Story().waits("a", "b", "c").wait("a", H100).freed(GPU, "H100").take(0), [["a", "b"]]),
    ("a pod nudged and turned away again joins the end of the line",
     Story().waits("a", "b", "c").freed(GPU, "H100").take(0).waits("a", "b")
     .freed(GPU, "H100").take(5), [["a", "b"], ["c", "a"]]),
    ("a pod that waits on a new key waits no longer on the old",
     Story().wait("a", H100).wait("a", A100).freed(GPU, "H100").take(0), [[]]),
    ("a pod turned away for nothing a freeing gives is forgotten",
     Story().wait("a", H100).wait("a").freed(GPU, "H100").take(0), [[]]),
    ("a pod bound or deleted is forgotten",
     Story().waits("a", "b").forget("a").freed(GPU, "H100").take(0), [["b"]]),
    ("a freeing of every key of a kind: the longest waiting of all its keys",
     Story().wait("a", A100).wait("b", SMALL).wait("c", H100).wait("d", H100).freed(GPU)
     .take(0), [["a", "c"]]),
    ("a nudge is sent once", Story().waits("a").freed(GPU, "H100").take(0).take(5), [["a"], []]),
    ("a pod nudged less than a second ago waits for its second",
     Story().waits("a").freed(GPU, "H100").take(0).waits("a").freed(GPU, "H100").take(0.5)
     .take(0.99).take(1.0).take(1.5), [["a"], [], [], ["a"], []]),
    ("a nudge held back is dropped when filter turns the pod away again meanwhile",
     Story().waits("a").freed(GPU, "H100").take(0).waits("a").freed(GPU, "H100").take(0.5)
     .waits("a").take(1.0), [["a"], [], []]),
    ("a nudge held back is dropped when the pod is bound or deleted",
     Story().waits("a").freed(GPU, "H100").take(0).waits("a").freed(GPU, "H100").take(0.5)
     .forget("a").take(1.0), [["a"], [], []]),
    ("a nudge held back does not hold the others back",
     Story().waits("a").freed(GPU, "H100").take(0).waits("a", "b").freed(GPU, "H100")
     .take(0.5).take(1.0), [["a"], ["b"], ["a"]]),
    ("with no interval, a pod may be nudged on every freeing",
     Story(interval_s=0).waits("a").freed(GPU, "H100").take(0).waits("a").freed(GPU, "H100")
     .take(0), [["a"], ["a"]]),
    ("the book holds capacity pods: the longest waiting go first",
     Story(capacity=2).waits("a", "b", "c").freed(GPU, "H100").take(0), [["b", "c"]]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "story", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_book_nudges_who_waits_for_what_freed(
    name: str, story: Story, expected: list[list[str]]
) -> None:
    assert story.nudged() == expected


def test_a_nudge_names_the_pod_and_what_freed_for_it() -> None:
    book = WaitBook()
    book.wait("a", "ns/a", [SMALL, POOL])
    book.freed(ADDRESS, "rack-a")
    assert book.take(0) == [Nudge("ns/a", "a", ADDRESS)]


def test_next_at_says_when_the_first_nudge_held_back_may_go() -> None:
    book = WaitBook(interval_s=1.0)
    assert book.next_at() is None
    for uid, at in (("a", 0.0), ("b", 0.25)):
        book.wait(uid, f"ns/{uid}", [H100])
        book.freed(GPU, "H100")
        book.take(at)
    assert book.next_at() is None  # each was sent at once
    for uid in ("b", "a"):
        book.wait(uid, f"ns/{uid}", [H100])
    book.freed(GPU, "H100", count=2)
    assert book.take(0.5) == []
    assert book.next_at() == 1.0  # a's second, then b's
    assert [n.uid for n in book.take(1.0)] == ["a"]
    assert book.next_at() == 1.25
    assert [n.uid for n in book.take(1.25)] == ["b"]
    assert book.next_at() is None


def test_the_book_stays_within_its_capacity_however_many_pods_wait_and_are_nudged() -> None:
    book = WaitBook(per_event=1000, capacity=10)
    for round_ in range(5):
        for i in range(50):
            book.wait(f"p{round_}-{i}", "ns/p", [H100])
        assert len(book) == 10
        book.freed(GPU, "H100")
        assert len(book) == 10  # all due now
        assert len(book.take(float(round_))) == 10
        assert len(book) == 0
    book.wait("a", "ns/a", [H100])
    book.forget("a")
    assert len(book) == 0
    assert not book.waiting(GPU, "H100")


@pytest.mark.parametrize(
    "arguments",
    [{"per_event": 0}, {"capacity": 0}, {"interval_s": -1.0}],
    ids=["no pod per freeing", "no room", "a negative interval"],
)
def test_a_book_that_could_never_nudge_is_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="per_event and capacity"):
        WaitBook(**arguments)  # type: ignore[arg-type]
