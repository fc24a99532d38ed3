"""List pages in protobuf (app/kube/list_pages.py) on bytes built here with the same
messages: the envelope, what is left out as JSON leaves it out, the containers read once per
template in a bounded book, and the decoders' way back to JSON when a page will not decode.
That the values equal the JSON's for what a real API server writes is the e2e tier's
test_list_pages."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from app.kube import list_pages
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
    pod = _pod("a", _container("main", "1"), affinity=affinity)
    spec = list_pages.pod_page(_page(pod))["items"][0]["spec"]
    assert spec["affinity"] == {
        "nodeAffinity": {},
        "podAntiAffinity": {list_pages.PREFERRED: [{}, {}]},
    }


def test_the_pods_of_one_template_share_its_containers_read_once() -> None:
    main = _container("main", "1")
    page = list_pages.pod_page(_page(_pod("a", main), _pod("b", main), _pod("c", main, main)))
    a, b, c = (p["spec"]["containers"] for p in page["items"])
    assert a is b  # read once
    assert a == [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]
    assert c is not a
    assert len(c) == 2


def test_the_template_book_is_bounded() -> None:
    templates = list_pages._Templates()
    for i in range(templates.CAPACITY + 10):
        templates.read([_container("main", f"{i}m")], [])
    assert len(templates._book) == templates.CAPACITY
    first = templates.read([_container("main", "0m")], [])  # evicted: read again, same values
    assert first[0][0]["resources"] == {"requests": {"cpu": "0m"}}


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
    [b'{"items": []}', MAGIC + b"\xff\xff\xff", _answer(wire.Quantity(string="x"))[:-1]],
    ids=["json", "garbage after the magic", "truncated"],
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
