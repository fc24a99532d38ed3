"""List pages in protobuf (app/kube/list_pages.py) on bytes built here with the same
messages: the envelope, what is left out as JSON leaves it out, the containers read once per
template in a bounded book, and the decoders' way back to JSON when a page will not decode.
That the values equal the JSON's for what a real API server writes is the e2e tier's
test_list_pages."""

from __future__ import annotations

import logging
import typing
from typing import Any

import orjson
import pytest

from app.kube import list_pages, shapes
from app.kube.shapes import Decoders, _PodEvent, _PodPage
from app.kube.wire import lists_pb2 as wire

pytestmark = pytest.mark.unit

MAGIC = b"k8s\x00"


def _answer(message: Any) -> bytes:
    return MAGIC + wire.Unknown(raw=message.SerializeToString()).SerializeToString()


def _container(name: str, cpu: str, **more: Any) -> bytes:
    resources = wire.ResourceRequirements(requests={"cpu": wire.Quantity(string=cpu)})
    return wire.Container(name=name, resources=resources, **more).SerializeToString()


def _pod(name: str, *containers: bytes, **spec: Any) -> Any:
    meta = wire.ObjectMeta(name=name, namespace="ns", uid=f"{name}-uid", resourceVersion="7")
    return wire.Pod(metadata=meta, spec=wire.PodSpec(containers=list(containers), **spec))


def _page(*pods: Any, token: str = "") -> bytes:
    meta = wire.ListMeta(resourceVersion="9", **{"continue": token} if token else {})
    return _answer(wire.PodList(metadata=meta, items=list(pods)))


def test_a_page_decodes_to_json_values_and_leaves_out_what_json_leaves_out() -> None:
    sidecar = _container("proxy", "250m", restartPolicy="Always")
    pod = _pod("a", _container("main", "2"), initContainers=[sidecar], nodeName="n1", priority=0)
    page = list_pages.pod_page(_page(pod, token="next"))
    assert page == {
        "metadata": {"resourceVersion": "9", "continue": "next"},
        "items": [{
            "metadata": {"name": "a", "namespace": "ns", "uid": "a-uid", "resourceVersion": "7"},
            "spec": {
                "containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}],
                "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                                    "resources": {"requests": {"cpu": "250m"}}}],
                "nodeName": "n1",
                "priority": 0,  # set, though zero: JSON writes a pointer that is set
            },
            "status": {},
        }],
    }  # fmt: skip


def test_affinity_keeps_only_whether_each_kind_prefers() -> None:
    affinity = wire.Affinity(
        nodeAffinity=wire.NodeAffinity(),
        podAntiAffinity=wire.PodAntiAffinity(
            preferredDuringSchedulingIgnoredDuringExecution=[wire.Term(), wire.Term()]
        ),
    )
    pod = _pod("a", _container("main", "1"), affinity=affinity.SerializeToString())
    spec = list_pages.pod_page(_page(pod))["items"][0]["spec"]
    assert spec["affinity"] == {
        "nodeAffinity": {},
        "podAntiAffinity": {list_pages.PREFERRED: [{}, {}]},
    }


def test_the_pods_of_one_template_share_its_parts_read_once() -> None:
    main, init = _container("main", "1"), _container("fetch", "2")
    owner = wire.OwnerReference(kind="Job", name="j", uid="u", apiVersion="batch/v1")
    owned = wire.ObjectMeta(name="x", ownerReferences=[owner.SerializeToString()])
    pods = [_pod(name, main, initContainers=[init]) for name in "ab"]
    pods += [_pod("c", main, main), wire.Pod(metadata=owned), wire.Pod(metadata=owned)]
    a, b, c, d, e = list_pages.pod_page(_page(*pods))["items"]
    assert a["spec"]["containers"] is b["spec"]["containers"]  # read once
    assert a["spec"]["initContainers"] is b["spec"]["initContainers"]
    assert a["spec"]["containers"] == [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]
    assert c["spec"]["containers"] is not a["spec"]["containers"]
    assert len(c["spec"]["containers"]) == 2
    assert d["metadata"]["ownerReferences"] is e["metadata"]["ownerReferences"]
    assert d["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}
    ]


def _read_parts(parts: tuple[bytes, ...]) -> list[bytes]:
    return list(parts)


def test_a_book_of_shared_parts_is_bounded() -> None:
    book = list_pages._Shared(_read_parts)
    for i in range(book.CAPACITY + 10):
        book.read([b"%d" % i])
    assert len(book._book) == book.CAPACITY
    assert (b"0",) not in book._book  # the oldest went first
    assert book.read([b"0"]) == [b"0"]  # read again when asked again


def test_parts_too_large_to_keep_are_read_every_time() -> None:
    book = list_pages._Shared(_read_parts)
    large = b"x" * (book.MAX_KEY_BYTES + 1)
    first, again = book.read([large]), book.read([large])
    assert first == again
    assert first is not again
    assert not book._book


def test_a_node_page_keeps_its_resources() -> None:
    status = wire.NodeStatus(
        capacity={"nvidia.com/gpu": wire.Quantity(string="8")},
        allocatable={"nvidia.com/gpu": wire.Quantity(string="7")},
    )
    node = wire.Node(metadata=wire.ObjectMeta(name="n1", labels={"gpu": "yes"}), status=status)
    body = _answer(wire.NodeList(metadata=wire.ListMeta(resourceVersion="3"), items=[node]))
    assert list_pages.node_page(body) == {
        "metadata": {"resourceVersion": "3"},
        "items": [{
            "metadata": {"name": "n1", "labels": {"gpu": "yes"}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "7"}},
        }],
    }  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        b'{"items": []}',
        MAGIC + b"\xff\xff\xff",
        _answer(wire.Quantity(string="x"))[:-1],
        MAGIC + wire.Unknown(raw=b"\xff\xff").SerializeToString(),
        MAGIC + b"\x0d\x00\x00\x00\x00",
    ],
    ids=["json", "garbage after the magic", "truncated", "garbage inside", "a fixed32 field"],
)
def test_bytes_that_are_not_a_protobuf_page_raise_value_error(body: bytes) -> None:
    with pytest.raises(ValueError, match="protobuf"):
        list_pages.pod_page(body)


def test_a_status_answered_in_protobuf_gives_its_message_and_reason() -> None:
    status = wire.Status(
        status="Failure", message='pods "x" not found', reason="NotFound", code=404
    )
    assert list_pages.status_fields(_answer(status)) == ('pods "x" not found', "NotFound")
    assert list_pages.status_fields(b'{"kind": "Status"}') is None


def test_decoders_read_each_page_as_what_it_is() -> None:
    decoders = Decoders("pods", _PodPage, _PodEvent, protobuf=list_pages.pod_page)
    assert decoders.accept == list_pages.ACCEPT
    json_page = orjson.dumps({"metadata": {"resourceVersion": "9"}, "items": []})
    assert decoders.list(json_page) == {"metadata": {"resourceVersion": "9"}, "items": []}
    assert decoders.list(_page())["metadata"] == {"resourceVersion": "9"}


def test_decoders_ask_for_json_once_a_protobuf_page_does_not_decode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    decoders = Decoders("pods", _PodPage, _PodEvent, protobuf=list_pages.pod_page)
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="protobuf"):
        decoders.list(MAGIC + b"\xff\xff")
    assert "listing JSON" in caplog.text
    assert decoders.accept == "application/json"  # the list is retried in JSON
    with pytest.raises(ValueError, match="asked for JSON"):
        decoders.list(_page())  # and a protobuf answer to that is refused


def test_decoders_without_protobuf_ask_for_json() -> None:
    decoders = Decoders("pods", _PodPage, _PodEvent)
    assert decoders.accept == "application/json"


# Fields lists.proto keeps as a message's bytes, read by list_pages from those bytes.
AS_BYTES = {
    ("PodSpec", "containers"): wire.Container,
    ("PodSpec", "initContainers"): wire.Container,
    ("PodSpec", "affinity"): wire.Affinity,
    ("ObjectMeta", "ownerReferences"): wire.OwnerReference,
}


def _shape_fields(shape: Any) -> dict[str, Any]:
    """A TypedDict's fields, each with the TypedDict below it (None where the shape keeps the
    whole value)."""
    fields: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(shape).items():
        below = [a for a in _flatten(hint) if typing.is_typeddict(a)]
        fields[name] = below[0] if below else None
    return fields


def _flatten(hint: Any) -> list[Any]:
    args = typing.get_args(hint)
    return [hint] if not args else [leaf for arg in args for leaf in _flatten(arg)]


def _missing(shape: Any, message: Any, path: str) -> list[str]:
    descriptor = message.DESCRIPTOR
    missing = []
    for name, below in _shape_fields(shape).items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            missing.append(f"{path}.{name}")
        elif below is not None:
            inner = AS_BYTES.get((descriptor.name, name)) or getattr(wire, field.message_type.name)
            missing += _missing(below, inner, f"{path}.{name}")
    return missing


@pytest.mark.parametrize(
    ("shape", "message"),
    [(shapes._Pod, wire.Pod), (shapes._Node, wire.Node)],
    ids=["pod", "node"],
)
def test_every_field_the_json_shapes_keep_is_in_the_protobuf_messages(
    shape: Any, message: Any
) -> None:
    """A field the core starts to read goes into shapes.py and lists.proto both: one added to
    the JSON shapes alone would be missing from every listed object here."""
    watch_errors = set(typing.get_type_hints(shapes._Status))  # a watch ERROR's, never listed
    missing = [m for m in _missing(shape, message, "") if m.lstrip(".") not in watch_errors]
    assert not missing, f"in shapes.py but not in wire/lists.proto: {missing}"
