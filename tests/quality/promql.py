"""The metric names a PromQL expression reads, from a small tokenizer (enough for alert rules
and Grafana panels, not a full parser).

An identifier is a metric name unless it is a function or aggregation (followed by ``(``,
or an aggregation name before ``by``/``without``), a keyword (``by``, ``on``, ``bool``,
``and``, ``offset``, …), a label name (inside ``{…}``, or in the parentheses after ``by``,
``without``, ``on``, ``ignoring``, ``group_left``, ``group_right``). A ``__name__``
matcher's value names a metric too. Strings, numbers, durations, ranges and subqueries
(``[5m]``, ``[$__rate_interval]``, ``[1h:5m]``), comments and Grafana variables
(``$job``, ``${job}``) are skipped. Unbalanced brackets or an unknown character raise
:class:`PromQLError`, so a broken expression cannot pass as "names nothing unknown"."""

from __future__ import annotations

import re

__all__ = ["PromQLError", "metric_names"]


class PromQLError(ValueError):
    pass


# Aggregation operators: "sum by (x) (…)" puts the grouping before the parenthesis.
AGGREGATIONS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "atan2", "inf", "nan"}
)  # fmt: skip
# These take a parenthesised list of label names.
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
  | (?P<number>(?:0x[0-9a-fA-F]+|[0-9][0-9a-zA-Z_.]*(?:[eE][-+][0-9]+)?))
  | (?P<identifier>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
  | (?P<operator>==|!=|=~|!~|<=|>=|[-+*/%^<>=,@:])
    """,
    re.VERBOSE,
)
_CLOSING = {"(": ")", "{": "}", "[": "]"}


def _tokens(expression: str) -> list[tuple[str, str]]:
    found, position = [], 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise PromQLError(f"unexpected {expression[position]!r} at {position}: {expression}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("space", "comment"):
            found.append((kind, match.group()))
        position = match.end()
    return found


def metric_names(expression: str) -> set[str]:
    """Every metric name ``expression`` selects."""
    tokens = _tokens(expression)
    names: set[str] = set()
    stack: list[str] = []  # open brackets; "L" for a parenthesised label list
    previous: tuple[str, str] | None = None
    for index, (kind, text) in enumerate(tokens):
        following = tokens[index + 1] if index + 1 < len(tokens) else ("", "")
        inside = stack[-1] if stack else ""
        if kind == "open":
            if inside == "[":
                raise PromQLError(f"a bracket inside a range: {expression}")
            label_list = (
                text == "("
                and previous is not None
                and previous[0] == "identifier"
                and previous[1].lower() in LABEL_LISTS
            )
            stack.append("L" if label_list else text)
        elif kind == "close":
            opened = stack.pop() if stack else None
            if opened is None or _CLOSING["(" if opened == "L" else opened] != text:
                raise PromQLError(f"unbalanced {text!r}: {expression}")
        elif inside in ("[", "L"):
            pass  # durations, subquery steps, Grafana intervals; label names
        elif kind == "identifier" and inside == "{":
            # A label name; only __name__="…" names a metric.
            value = tokens[index + 2] if index + 2 < len(tokens) else ("", "")
            if text == "__name__" and following == ("operator", "=") and value[0] == "string":
                names.add(value[1][1:-1])
        elif kind == "identifier":
            called = following == ("open", "(")
            word = text.lower()  # keywords and operators are case-insensitive
            if not called and word not in KEYWORDS and word not in AGGREGATIONS:
                names.add(text)
        previous = (kind, text)
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r}: {expression}")
    return names
