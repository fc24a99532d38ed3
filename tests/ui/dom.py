"""A small element tree over the stdlib HTML parser, enough to count and read the elements
of the DOM that headless Chromium dumps."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = ["Element", "parse"]

# Elements without an end tag: they never hold children.
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


@dataclass(eq=False)
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def __getitem__(self, name: str) -> str:
        return self.attrs[name]

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.attrs.get(name, default)

    def text(self) -> str:
        """The text content, with whitespace runs collapsed as a reader sees it."""
        return " ".join(self._raw_text().split())

    def _raw_text(self) -> str:
        return "".join(c if isinstance(c, str) else c._raw_text() for c in self.children)

    def descendants(self) -> list[Element]:
        found: list[Element] = []
        for child in self.children:
            if isinstance(child, Element):
                found.append(child)
                found.extend(child.descendants())
        return found

    def all(self, class_name: str) -> list[Element]:
        """Every descendant carrying the class, in document order."""
        return [e for e in self.descendants() if class_name in e.classes]

    def one(self, class_name: str) -> Element:
        found = self.all(class_name)
        assert len(found) == 1, f"expected one .{class_name}, found {len(found)}"
        return found[0]

    def by_id(self, element_id: str) -> Element:
        found = [e for e in self.descendants() if e.attrs.get("id") == element_id]
        assert len(found) == 1, f"expected one #{element_id}, found {len(found)}"
        return found[0]


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self._open[-1].children.append(element)
        if tag not in _VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        # Chromium serializes a well-formed tree; still, close up to the matching element.
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
