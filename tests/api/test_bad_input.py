"""Every class of bad input gets a specific message in the protocol's terms, never FastAPI's
422 page or a 500 with a traceback, and the service keeps serving."""

from __future__ import annotations

import gzip
import socket
import time

import orjson
import pytest

from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer

FILTER_ERROR_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]

BAD_BODIES = [
    ("malformed json", b'{"Pod": {', "not valid JSON"),
    ("empty body", b"", "empty request body"),
    ("not an object", b"[1, 2]", "must be a JSON object, got a list"),
    (
        "pod is not an object",
        b'{"Pod": "web-1", "NodeNames": ["a"]}',
        "Pod must be a pod object, got a string",
    ),
    ("pod missing", b'{"NodeNames": ["a"]}', "Pod must be a pod object, got null"),
    (
        "node names not a list",
        b'{"Pod": {}, "NodeNames": "a,b"}',
        "NodeNames must be a list of node names",
    ),
    (
        "node names not strings",
        b'{"Pod": {}, "NodeNames": [1, 2]}',
        "NodeNames must be a list of node names",
    ),
    (
        "neither names nor nodes",
        b'{"Pod": {}, "Nodes": null, "NodeNames": null}',
        "neither NodeNames nor Nodes",
    ),
    (
        "nodes without items",
        b'{"Pod": {}, "Nodes": {"metadata": {}}}',
        "NodeList with an items list",
    ),
    (
        "node without a name",
        b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}',
        "needs metadata.name",
    ),
    # once "str is not valid UTF-8: surrogates not allowed"
    (
        "not utf-8",
        b'{"Pod": "\xff\xfe"}',
        "request body is not valid UTF-8 JSON (byte 9 is not UTF-8): send JSON encoded in UTF-8",
    ),
    (
        "gzip-compressed, without saying so",
        gzip.compress(b'{"Pod": {}, "NodeNames": ["a"]}'),
        "request body is gzip-compressed: Content-Encoding is not supported",
    ),
]


@pytest.mark.parametrize(
    ("body", "message"), [(b, m) for _, b, m in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES]
)
def test_bad_filter_request_is_answered_in_the_error_field(
    demo: RunningServer, body: bytes, message: str
) -> None:
    with demo.client() as client:
        response = client.post("/filter", content=body)
        assert response.status_code == 200
        result = response.json()
        assert list(result) == FILTER_ERROR_KEYS
        assert message in result["Error"]
        assert result["NodeNames"] is None
        assert result["Nodes"] is None
        assert "Traceback" not in response.text
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("body", "message"), [(b, m) for _, b, m in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES]
)
def test_bad_prioritize_request_gets_a_4xx_with_a_message(
    demo: RunningServer, body: bytes, message: str
) -> None:
    with demo.client() as client:
        response = client.post("/prioritize", content=body)
    assert response.status_code == 400
    assert message in response.json()["Error"]


PREEMPT_BODIES = [
    ("malformed json", b"{", "not valid JSON"),
    ("no victims map", b'{"Pod": {}}', "neither NodeNameToMetaVictims nor NodeNameToVictims"),
    (
        "victims not a map",
        b'{"Pod": {}, "NodeNameToMetaVictims": [1]}',
        "must be an object keyed by node name",
    ),
    (
        "pods not a list",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": 3}}}',
        "Pods must be a list",
    ),
    (
        "victim without uid",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}}',
        "every victim needs a UID",
    ),
    (
        "victim uid is a number",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}}',
        "NodeNameToMetaVictims['n']: every victim needs a UID (Pods[].UID, a string)",
    ),
    (
        "full victim pod without metadata.uid",
        b'{"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {"name": "v"}}]}}}',
        "NodeNameToVictims['n']: every victim needs a UID (Pods[].metadata.uid, a string)",
    ),
    (
        "victims entry is a list",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": [1]}}',
        "NodeNameToMetaVictims['n'] must be an object with Pods and NumPDBViolations, got a list",
    ),
    (
        "victims entry is a string",
        b'{"Pod": {}, "NodeNameToVictims": {"n": "v1"}}',
        "NodeNameToVictims['n'] must be an object with Pods and NumPDBViolations, got a string",
    ),
    (
        "a victim is not an object",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "u"}, "u2"]}}}',
        "NodeNameToMetaVictims['n'].Pods[1] must be an object, got a string",
    ),
    (
        "pdb violations is a string",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": "x"}}}',
        "NodeNameToMetaVictims['n'].NumPDBViolations must be a non-negative integer, got a string",
    ),
    (
        "pdb violations is a fraction",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": 1.5}}}',
        "NumPDBViolations must be a non-negative integer, got a floating-point number",
    ),
    (
        "pdb violations is a boolean",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": true}}}',
        "NumPDBViolations must be a non-negative integer, got a boolean",
    ),
    (
        "pdb violations is negative",
        b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": -1}}}',
        "NumPDBViolations must be a non-negative integer, got a negative number",
    ),
    (
        "lower-cased keys are read, and their types checked too",
        b'{"pod": {}, "nodenametometavictims": {"n": {"pods": [], "numpdbviolations": "2"}}}',
        "NodeNameToMetaVictims['n'].NumPDBViolations must be a non-negative integer",
    ),
]


@pytest.mark.parametrize(
    ("body", "message"),
    [(b, m) for _, b, m in PREEMPT_BODIES],
    ids=[n for n, _, _ in PREEMPT_BODIES],
)
def test_bad_preempt_request_gets_a_4xx_with_a_message(
    demo: RunningServer, body: bytes, message: str
) -> None:
    with demo.client() as client:
        response = client.post("/preempt", content=body)
    assert response.status_code == 400
    assert message in response.json()["Error"]


BIND_BODIES = [
    ("malformed json", b"nope", "not valid JSON"),
    (
        "missing node",
        b'{"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}',
        "ExtenderBindingArgs.Node must be a non-empty string",
    ),
    (
        "uid is a number",
        b'{"PodName": "p", "PodNamespace": "ns", "PodUID": 7, "Node": "n"}',
        "PodUID must be a non-empty string",
    ),
]


@pytest.mark.parametrize(
    ("body", "message"), [(b, m) for _, b, m in BIND_BODIES], ids=[n for n, _, _ in BIND_BODIES]
)
def test_bad_bind_request_is_answered_in_the_error_field(
    demo: RunningServer, body: bytes, message: str
) -> None:
    with demo.client() as client:
        response = client.post("/bind", content=body)
    assert response.status_code == 200
    assert list(response.json()) == ["Error"]
    assert message in response.json()["Error"]


def test_oversized_bodies_are_refused_and_the_service_keeps_serving(serve: Serve) -> None:
    server = serve(settings={"server": {"max_body_bytes": 4096}})
    big = b'{"Pod": {}, "NodeNames": [' + b",".join(b'"node-%d"' % i for i in range(2000)) + b"]}"
    with server.client() as client:
        filtered = client.post("/filter", content=big)
        assert filtered.status_code == 200
        assert "exceeds the 4096-byte limit" in filtered.json()["Error"]
        prioritized = client.post("/prioritize", content=big)
        assert prioritized.status_code == 413
        assert "exceeds the 4096-byte limit" in prioritized.json()["Error"]
        preempted = client.post("/preempt", content=_oversized_preempt_body())
        assert preempted.status_code == 413
        assert "exceeds the 4096-byte limit" in preempted.json()["Error"]
        # the same keep-alive pool keeps working
        ok = client.post("/filter", content=_fixture_bytes())
        assert ok.status_code == 200
        assert ok.json()["Error"] == ""


def test_oversized_chunked_body_without_length_is_refused(serve: Serve) -> None:
    server = serve(settings={"server": {"max_body_bytes": 4096}})

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(10):
            yield b" " * 1024

    with server.client() as client:
        response = client.post("/bind", content=chunks())
    assert "exceeds the 4096-byte limit" in response.json()["Error"]


def test_a_body_that_never_finishes_arriving_is_cut_off(serve: Serve) -> None:
    server = serve(settings={"server": {"body_timeout_s": 0.3}})
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"Pod":'
        )
        started = time.monotonic()
        answer = _read_response(sock)
        elapsed = time.monotonic() - started
    assert "200 OK" in answer
    assert "not received within 0.3s" in answer
    assert elapsed < 5  # bounded by the body timeout, not by the client
    with server.client() as client:
        assert client.get("/healthz").status_code == 200


def test_a_client_that_leaves_mid_body_is_a_rejected_request_not_an_error(serve: Serve) -> None:
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"Pod":'
        )
    with server.client() as client:
        deadline = time.monotonic() + 5
        text = ""
        while 'outcome="rejected",verb="filter"} 1.0' not in text:
            assert time.monotonic() < deadline, "the cut-off request was never counted"
            text = client.get("/metrics").text
            time.sleep(0.02)
        assert 'outcome="error"' not in text
        assert client.get("/healthz").status_code == 200


def test_unknown_paths_and_methods_get_json_not_tracebacks(demo: RunningServer) -> None:
    with demo.client() as client:
        missing = client.post("/filterz", content=b"{}")
        wrong_method = client.get("/filter")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/json"
    assert wrong_method.status_code == 405
    assert "Traceback" not in missing.text + wrong_method.text


def _read_response(sock: socket.socket) -> str:
    """One whole HTTP response (headers and Content-Length body), bounded by the socket timeout."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def _oversized_preempt_body() -> bytes:
    """A well-formed preempt request (many UID victims), only too big."""
    victims = ",".join(f'{{"UID": "victim-{i}"}}' for i in range(300))
    return (
        f'{{"Pod": {{}}, "NodeNameToMetaVictims": {{"n": {{"Pods": [{victims}],'
        f' "NumPDBViolations": 0}}}}}}'
    ).encode()


def _fixture_bytes() -> bytes:
    return orjson.dumps(fixture("filter_request_nodecache_true.json"))


def test_preempt_with_no_victims_on_a_node_is_answered_not_refused(demo: RunningServer) -> None:
    # Go decodes a null *Victims as nil, and a missing count as 0: both are valid requests.
    body = b'{"Pod": {}, "NodeNameToMetaVictims": {"n": null, "m": {"Pods": null}}}'
    with demo.client() as client:
        response = client.post("/preempt", content=body)
    assert response.status_code == 200
    assert response.json() == {"NodeNameToMetaVictims": {}}


def _pod_asking(gpus: object, **spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": "asks", "namespace": "default", "uid": "uid-asks"},
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
            **spec,
        },
    }


# (id, pod, the reason filter gives every node, prioritize answers and bind repeats)
BAD_PODS = [
    # Python's int() refuses more than 4300 digits with a ValueError: once a 500
    ("a quantity of 5000 digits", _pod_asking("1" * 5000),
     "schedext: invalid pod: container 'main': nvidia.com/gpu is not a quantity: "
     "'1111111111111111111111111111111111111111...' (5000 characters)"),
    ("a quantity over 2^63-1", _pod_asking("1e30"),
     "schedext: invalid pod: container 'main': nvidia.com/gpu is out of range (over 2^63-1): "
     "'1e30'"),
    # once read as priority 0, silently
    ("a priority in words", _pod_asking("1", priority="high"),
     "schedext: invalid pod: spec.priority must be a whole number (an int32, as the priority "
     "class sets it), got 'high'"),
    # once read as a pod that asks for nothing: no model rule, or no GPU at all
    ("an annotation that is a number",
     {**_pod_asking("1"), "metadata": {"name": "asks", "namespace": "default", "uid": "uid-asks",
                                      "annotations": {"schedext.io/gpu-model": 100}}},
     "schedext: invalid pod: metadata.annotations['schedext.io/gpu-model'] must be a string, "
     "got a number (100)"),
    ("annotations that are a list",
     {**_pod_asking("1"), "metadata": {"name": "asks", "namespace": "default", "uid": "uid-asks",
                                      "annotations": ["schedext.io/gpu-model"]}},
     "schedext: invalid pod: metadata.annotations must be a map of strings, got a list"),
    ("containers that are not a list of objects",
     {**_pod_asking("1"), "spec": {"containers": {"main": {}}}},
     "schedext: invalid pod: spec.containers must be a list of objects, got an object"),
    ("a spec that is not an object",
     {**_pod_asking("1"), "spec": "gpu"},
     "schedext: invalid pod: spec must be an object, got a string ('gpu')"),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "reason"), [c[1:] for c in BAD_PODS], ids=[c[0] for c in BAD_PODS])
@pytest.mark.parametrize("path", ["in place", "asgi"])
def test_an_unreadable_pod_gets_its_reason_from_filter_prioritize_and_bind(
    demo: RunningServer, pod: dict[str, object], reason: str, path: str
) -> None:
    query = "?via=asgi" if path == "asgi" else ""
    body = orjson.dumps({"Pod": pod, "NodeNames": ["gpu-node-a", "cpu-node-1"]})
    binding = {"PodName": "asks", "PodNamespace": "default", "PodUID": "uid-asks"}
    with demo.client() as client:
        filtered = client.post(f"/filter{query}", content=body)
        prioritized = client.post(f"/prioritize{query}", content=body)
        bound = client.post("/bind", json={**binding, "Node": "gpu-node-a"})
        assert client.get("/healthz").status_code == 200
    # not "never went through filter here": filter saw it, and refused it
    assert bound.json() == {"Error": f"pod default/asks: {reason}"}
    assert filtered.status_code == 200
    assert filtered.json()["FailedAndUnresolvableNodes"] == {
        "gpu-node-a": reason,
        "cpu-node-1": reason,
    }
    assert (prioritized.status_code, prioritized.json()) == (400, {"Error": reason})


@pytest.mark.parametrize(("pod", "reason"), [c[1:] for c in BAD_PODS], ids=[c[0] for c in BAD_PODS])
def test_preempt_of_an_unreadable_pod_answers_why(
    demo: RunningServer, pod: dict[str, object], reason: str
) -> None:
    # not an empty answer that hides it: the same words as prioritize, as a 400
    victims = {"gpu-node-a": {"Pods": [{"UID": "victim-1"}], "NumPDBViolations": 0}}
    body = orjson.dumps({"Pod": pod, "NodeNameToMetaVictims": victims})
    with demo.client() as client:
        response = client.post("/preempt", content=body)
    assert (response.status_code, response.json()) == (400, {"Error": reason})


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
@pytest.mark.parametrize("path", ["in place", "asgi"])
def test_a_compressed_body_is_refused_for_its_content_encoding(
    demo: RunningServer, verb: str, path: str
) -> None:
    # once "surrogates not allowed": filter and bind in the Error field, the others 415
    body = gzip.compress(orjson.dumps(fixture("filter_request_nodecache_true.json")))
    query = "?via=asgi" if path == "asgi" else ""
    with demo.client() as client:
        response = client.post(
            f"/{verb}{query}", content=body, headers={"Content-Encoding": "gzip"}
        )
        assert client.get("/healthz").status_code == 200
    error = "Content-Encoding gzip is not supported: send the body as plain JSON"
    in_body = verb in ("filter", "bind")
    assert response.status_code == (200 if in_body else 415)
    assert response.json()["Error"] == error
