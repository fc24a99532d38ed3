"""Packed node names: the compiled extender._packed and its pure-Python twin give the same
answers, and the request decoder takes the packed path exactly when it is safe."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from app.service import wire
from extender import _packed_py, node_slots, packed, policy
from extender.packed import PackedNames
from testbed.builders import make_node, make_pod
from tests.unit.helpers import scheduler_with

try:
    from extender import _packed as native
except ImportError:  # pragma: no cover - only where no C compiler was at hand
    native = None

IMPLEMENTATIONS = [pytest.param(_packed_py, id="python")] + (
    [pytest.param(native, id="native")] if native is not None else []
)


def test_the_native_module_is_built_wherever_a_compiler_is() -> None:
    """The install builds it silently or not at all (optional): catch a broken build here."""
    if shutil.which("cc") or shutil.which("gcc"):
        assert packed.NATIVE, "extender._packed did not build; run pip install -e . to see why"


@dataclass
class ScanCase:
    name: str
    span: bytes
    names: list[bytes] | None  # None: not plain


SCANS = [
    ScanCase("empty list", b"", []),
    ScanCase("one name", b'"n1"', [b"n1"]),
    ScanCase(
        "several", b'"a","bb","node-0001.example.com"', [b"a", b"bb", b"node-0001.example.com"]
    ),
    ScanCase("an empty name", b'"a",""', [b"a", b""]),
    ScanCase("long names cross word boundaries", b'"' + b"x" * 70 + b'","y"', [b"x" * 70, b"y"]),
    ScanCase("an escape", b'"a\\"b"', None),
    ScanCase("a unicode escape", b'"\\u00e9"', None),
    ScanCase("non-ASCII", '"é"'.encode(), None),
    ScanCase("a control byte", b'"a\tb"', None),
    ScanCase("DEL", b'"a\x7fb"', None),
    ScanCase("whitespace between names", b'"a", "b"', None),
    ScanCase("a trailing comma", b'"a",', None),
    ScanCase("a leading comma", b',"a"', None),
    ScanCase("an unterminated name", b'"a","b', None),
    ScanCase("no quotes", b"a,b", None),
    ScanCase("a number", b'"a",1', None),
    ScanCase("a nested list", b'"a",["b"]', None),
    ScanCase("two names without a comma", b'"a""b"', None),
    ScanCase("two commas", b'"a",,"b"', None),
    ScanCase("a comma inside a name is plain", b'"a,b","c"', [b"a,b", b"c"]),
    # The compiled scan reads 64 bytes at a time: names across and at the block edges.
    ScanCase("a span of exactly 64 bytes", b'"' + b"x" * 62 + b'"', [b"x" * 62]),
    ScanCase("a span of 65 bytes", b'"' + b"x" * 60 + b'",""', [b"x" * 60, b""]),
    ScanCase(
        "a closing quote on the last byte of a block",
        b'"' + b"a" * 62 + b'","b"',
        [b"a" * 62, b"b"],
    ),
    ScanCase(
        "a comma on the first byte of a block", b'"' + b"a" * 61 + b'","b"', [b"a" * 61, b"b"]
    ),
    ScanCase("a bad byte in the second block", b'"' + b"a" * 70 + b'\x01"', None),
    ScanCase("many short names", b",".join([b'"n"'] * 100), [b"n"] * 100),
]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", SCANS, ids=[c.name for c in SCANS])
def test_scan_finds_plain_names_and_only_those(impl: ModuleType, case: ScanCase) -> None:
    body = b"[" + case.span + b"]"
    pairs = impl.scan(body, 1, len(body) - 1)
    if case.names is None:
        assert pairs is None
        return
    assert pairs is not None
    table = np.frombuffer(pairs, dtype=np.int32).reshape(-1, 2).tolist()
    assert [body[o : o + n] for o, n in table] == case.names
    # Whatever plain form accepts is valid JSON that decodes to exactly those names.
    assert orjson.loads(body) == [n.decode() for n in case.names]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_scan_reads_nothing_outside_its_span(impl: ModuleType) -> None:
    body = b'\\"a","b"\xff\x00'
    pairs = impl.scan(body, 1, len(body) - 2)
    assert pairs is not None
    assert np.frombuffer(pairs, dtype=np.int32).tolist() == [2, 1, 6, 1]


@pytest.mark.skipif(native is None, reason="the compiled module was not built")
@pytest.mark.parametrize("seed", range(8))
def test_scan_agrees_with_the_python_twin_on_random_spans(seed: int) -> None:
    """The twin's scan is a regular expression: the reference for what plain form is."""
    rng = random.Random(seed)
    pieces = [b'"', b",", b"a", b"node-", b"\\", b"\x01", b"\x7f", "é".encode(), b" "]
    for _ in range(400):
        names = [rng.choice([b"", b"n", b"node-0042", b"x" * rng.randint(1, 90)]) for _ in range(8)]
        span = b",".join(b'"' + n + b'"' for n in names[: rng.randint(0, 8)])
        for _ in range(rng.choice([0, 0, 1, 2])):  # break it, sometimes
            at = rng.randint(0, len(span))
            span = span[:at] + rng.choice(pieces) + span[at + rng.randint(0, 1) :]
        body = b"[" + span + b"]"
        assert native.scan(body, 1, len(body) - 1) == _packed_py.scan(body, 1, len(body) - 1), span


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_scan_refuses_a_span_outside_the_buffer(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="outside"):
        impl.scan(b'"a"', 0, 10)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_resolve_maps_names_to_slots_and_unknown_names_to_zero(impl: ModuleType) -> None:
    names = [None, "n1", None, "n3", "node-with-a-rather-long-name-0042", "n" * 64]
    table = impl.NameTable(names)
    assert len(table) == 4
    body = b'"n3","nope","n1","","node-with-a-rather-long-name-0042","n1x","' + b"n" * 64 + b'"'
    ids = np.frombuffer(table.resolve(body, impl.scan(body, 0, len(body))), dtype=np.int32)
    assert ids.tolist() == [3, 0, 1, 0, 4, 0, 5]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_resolve_finds_every_name_of_a_large_table(impl: ModuleType) -> None:
    names: list[str | None] = [None, *(f"gpu-node-{i:05d}" for i in range(1, 5000))]
    table = impl.NameTable(names)
    order = [*range(4999, 0, -7), 0]
    body = b",".join(b'"' + (names[i] or "unknown-node").encode() + b'"' for i in order)
    ids = np.frombuffer(table.resolve(body, impl.scan(body, 0, len(body))), dtype=np.int32)
    assert ids.tolist() == order


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_table_refuses_the_same_name_twice(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="twice"):
        impl.NameTable([None, "a", "a"])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_name_pairs_outside_the_buffer_are_refused(impl: ModuleType) -> None:
    table = impl.NameTable([None, "a"])
    bad = np.array([[1, 50]], dtype=np.int32).tobytes()
    with pytest.raises(ValueError, match="outside"):
        table.resolve(b'"a"', bad)
    with pytest.raises(ValueError, match="outside"):
        impl.render(b'"a"', bad, np.zeros(1, dtype=np.int8), 0, b"", b",")


RENDER_BODY = b'"a","bb","c","dd","e"'
RENDER_CODES = np.array([0, 4, 0, 15, 4], dtype=np.int8)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_render_writes_the_names_of_one_code(impl: ModuleType) -> None:
    pairs = impl.scan(RENDER_BODY, 0, len(RENDER_BODY))
    assert impl.render(RENDER_BODY, pairs, RENDER_CODES, 0, b"", b",") == b'"a","c"'
    assert impl.render(RENDER_BODY, pairs, RENDER_CODES, 4, b':"x"', b",") == b'"bb":"x","e":"x"'
    assert impl.render(RENDER_BODY, pairs, RENDER_CODES, 9, b"", b",") == b""
    with pytest.raises(ValueError, match="one int8 per name"):
        impl.render(RENDER_BODY, pairs, RENDER_CODES[:2], 0, b"", b",")


@dataclass
class SectionsCase:
    name: str
    placements: dict[int, tuple[int, bytes]]  # code -> (section, suffix); others left out
    texts: list[bytes]
    answer: bytes


SECTIONS_CASES = [
    SectionsCase(
        "a filter answer: names, and each code's names into its map",
        {0: (0, b""), 4: (1, b':"m4"'), 15: (2, b':"m15"')},
        [b"[", b"]{", b"}{", b"}"],
        b'["a","c"]{"bb":"m4","e":"m4"}{"dd":"m15"}',
    ),
    SectionsCase(
        "two codes into one section, in input order",
        {4: (0, b":4"), 15: (0, b":15")},
        [b"<", b">"],
        b'<"bb":4,"dd":15,"e":4>',
    ),
    SectionsCase("nothing placed: the texts alone", {}, [b"[", b"][", b"]"], b"[][]"),
    SectionsCase("one text, no section", {}, [b"{}"], b"{}"),
    SectionsCase(
        "an empty section between full ones",
        {0: (0, b""), 4: (2, b"")},
        [b"(", b")(", b")(", b")"],
        b'("a","c")()("bb","e")',
    ),
]


@pytest.mark.parametrize("case", SECTIONS_CASES, ids=[c.name for c in SECTIONS_CASES])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_render_sections_writes_a_whole_answer_in_one_pass(
    impl: ModuleType, case: SectionsCase
) -> None:
    pairs = impl.scan(RENDER_BODY, 0, len(RENDER_BODY))
    placements: list[tuple[int, bytes] | None] = [None] * 16
    for code, placement in case.placements.items():
        placements[code] = placement
    assert impl.render_sections(RENDER_BODY, pairs, RENDER_CODES, placements, case.texts) == (
        case.answer
    )
    # A code beyond the placements is left out, as one placed None.
    assert impl.render_sections(RENDER_BODY, pairs, RENDER_CODES, [(0, b"")], [b"", b""]) == (
        b'"a","c"'
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_render_sections_refuses_what_it_cannot_write(impl: ModuleType) -> None:
    pairs = impl.scan(RENDER_BODY, 0, len(RENDER_BODY))
    with pytest.raises(ValueError, match="out of range"):
        impl.render_sections(RENDER_BODY, pairs, RENDER_CODES, [(1, b"")], [b"", b""])
    with pytest.raises(ValueError, match="texts"):
        impl.render_sections(RENDER_BODY, pairs, RENDER_CODES, [], [])
    with pytest.raises(ValueError, match="one int8 per name"):
        impl.render_sections(RENDER_BODY, pairs, RENDER_CODES[:2], [], [b""])
    if impl is not _packed_py:  # the twin trusts its types, as Python does
        with pytest.raises(TypeError):
            impl.render_sections(RENDER_BODY, pairs, RENDER_CODES, [(0, "str")], [b"", b""])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_render_scores_writes_host_priorities_but_zeros(impl: ModuleType) -> None:
    pairs = impl.scan(RENDER_BODY, 0, len(RENDER_BODY))
    scores = np.array([10, 0, 7, -3, 2**62], dtype=np.int64)
    answer = impl.render_scores(RENDER_BODY, pairs, scores)
    assert orjson.loads(b"[" + answer + b"]") == [
        {"Host": "a", "Score": 10},
        {"Host": "c", "Score": 7},
        {"Host": "dd", "Score": -3},
        {"Host": "e", "Score": 2**62},
    ]
    # leading and trailing zeros leave no stray comma
    only = impl.render_scores(RENDER_BODY, pairs, np.array([0, 0, 3, 0, 0], dtype=np.int64))
    assert only == b'{"Host":"c","Score":3}'
    assert impl.render_scores(RENDER_BODY, pairs, np.zeros(5, dtype=np.int64)) == b""
    with pytest.raises(ValueError, match="one int64 per name"):
        impl.render_scores(RENDER_BODY, pairs, scores[:1])


def test_packed_names_are_a_sequence_of_their_names() -> None:
    names = PackedNames.of(["g2", "g0", "g1"])
    assert names is not None
    assert len(names) == 3
    assert list(names) == ["g2", "g0", "g1"]
    assert names[1] == "g0"
    assert names == ["g2", "g0", "g1"]
    assert PackedNames.of([]) == []
    assert PackedNames.of(["é"]) is None


# ------------------------------------------------------------------ the request decoder

POD = make_pod("p", gpus=1)


def _go_body(names: list[str], pod: dict[str, Any] = POD) -> bytes:
    """ExtenderArgs exactly as kube-scheduler's encoder writes it: Pod, Nodes, NodeNames."""
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


@dataclass
class BodyCase:
    name: str
    body: bytes
    packed: bool


BODIES = [
    BodyCase("kube-scheduler's own encoding", _go_body(["n1", "n2"]), True),
    BodyCase("no names at all", _go_body([]), True),
    BodyCase(
        "a pod annotation spelled like the key",
        _go_body(["n1"], make_pod("p", gpus=1, annotations={"NodeNames": '["x"]'})),
        True,
    ),
    BodyCase("another key order", orjson.dumps({"NodeNames": ["n1"], "Pod": POD}), False),
    BodyCase("whitespace", b'{"Pod": ' + orjson.dumps(POD) + b', "NodeNames": ["n1"]}', False),
    BodyCase("an escaped name", _go_body(["n\u00e9"]).replace("é".encode(), b"\\u00e9"), False),
    BodyCase("a name Go would escape", _go_body(["a<b"]).replace(b"<", b"\\u003c"), False),
    BodyCase("lower-case keys", orjson.dumps({"pod": POD, "nodenames": ["n1"]}), False),
]


@pytest.mark.parametrize("case", BODIES, ids=[c.name for c in BODIES])
def test_the_decoder_packs_names_only_in_kube_schedulers_own_shape(case: BodyCase) -> None:
    args = wire.extender_args(case.body)
    assert isinstance(args.node_names, PackedNames) == case.packed
    document = orjson.loads(case.body)
    expected = document.get("NodeNames", document.get("nodenames"))
    assert list(args.node_names) == expected
    assert args.pod == document.get("Pod", document.get("pod"))


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod":{"metadata":{"name":"p"},"Nodes":null,"NodeNames":["n1"]}',  # inside the pod
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n1"]',  # not closed
        b'{"Pod":{"metadata":{"name":"p"}},,"NodeNames":["n1"]}',  # broken head
        b'["x",{"Pod":{}},"NodeNames":["n1"]}',  # not an object
        b'{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["n1",2]}',  # a number
    ],
)
def test_a_body_that_only_looks_packed_is_decoded_in_full_and_refused(body: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.extender_args(body)


@pytest.fixture(params=IMPLEMENTATIONS)
def packed_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The service's packed path on one implementation: the compiled module or, as on an
    install without a C compiler, the Python twin (in every module that imported from it)."""
    impl: ModuleType = request.param
    for name in ("NameTable", "count_codes", "render", "render_scores", "render_sections", "scan"):
        monkeypatch.setattr(packed, name, getattr(impl, name))
    monkeypatch.setattr(node_slots, "NameTable", impl.NameTable)
    monkeypatch.setattr(policy, "count_codes", impl.count_codes)
    return impl


@pytest.mark.usefixtures("packed_impl")
def test_filter_and_prioritize_answer_the_same_for_packed_and_plain_requests() -> None:
    nodes = [make_node(f"g{i}", gpus=4 if i % 3 else 0) for i in range(9)]
    holder = make_pod("holder", gpus=4, node="g1", gpu_ids=[0, 1, 2, 3])
    names = ["g4", "g0", "g1", "g8", "unknown", "g2", "g7"]
    answers = []
    for body in (_go_body(names), orjson.dumps({"NodeNames": names, "Pod": POD})):
        scheduler = scheduler_with(nodes, [holder])
        args = wire.extender_args(body)
        filtered = orjson.loads(
            wire.filter_result(scheduler.filter(args.pod, args.node_names), args)
        )
        if isinstance(args.node_names, PackedNames):
            kept = _go_body(filtered["NodeNames"])
        else:
            kept = orjson.dumps({"NodeNames": filtered["NodeNames"], "Pod": POD})
        again = wire.extender_args(kept)
        scores = scheduler.prioritize(again.pod, again.node_names)
        answers.append((filtered, orjson.loads(wire.host_priorities(again.node_names, scores))))
    (packed_filter, packed_scores), (plain_filter, plain_scores) = answers
    assert packed_filter == plain_filter
    assert packed_filter["NodeNames"] == ["g4", "g8", "g2", "g7"]
    assert set(packed_filter["FailedNodes"]) == {"g1"}
    assert set(packed_filter["FailedAndUnresolvableNodes"]) == {"g0", "unknown"}
    assert sorted(packed_scores, key=lambda s: s["Host"]) == sorted(
        plain_scores, key=lambda s: s["Host"]
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_count_codes_counts_each_code(impl: ModuleType) -> None:
    codes = np.array([3, 0, 3, 1, 3, 0], dtype=np.int8)
    assert impl.count_codes(codes, 5) == [2, 1, 0, 3, 0]
    assert impl.count_codes(codes[:0], 3) == [0, 0, 0]
    many = np.arange(5000, dtype=np.int64) % 22
    assert impl.count_codes(many.astype(np.int8), 22) == np.bincount(many).tolist()
    for bad, size in (([4], 4), ([-1], 4), ([0], 129)):
        with pytest.raises(ValueError, match=r"outside|size"):
            impl.count_codes(np.array(bad, dtype=np.int8), size)
