"""``kubectl schedext``: what each answer of the API server's service proxy means for the
person who ran it (a sentence that says what to do), decided from the status and body alone.
The bodies are the API server's own Status objects, as kube-apiserver writes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from app.plugin.access import (
    AccessError,
    ForbiddenError,
    NotFoundError,
    Target,
    UnreachableError,
    failure,
)

pytestmark = pytest.mark.unit

TARGET = Target()


def status(code: int, reason: str, message: str, **details: Any) -> bytes:
    """A metav1.Status as kube-apiserver answers it."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message, "reason": reason,
                            "code": code}  # fmt: skip
    if details:
        body["details"] = details
    return orjson.dumps(body)


@dataclass
class Case:
    name: str
    status: int
    body: bytes
    kind: type[AccessError]
    says: tuple[str, ...]


FORBIDDEN = (
    'services "http:schedext:views" is forbidden: User "alice" cannot get resource '
    '"services/proxy" in API group "" in the namespace "schedext-system"'
)

CASES = [
    Case(
        "RBAC refuses the service proxy: the permission and the role to ask for",
        403,
        status(403, "Forbidden", FORBIDDEN, name="http:schedext:views", kind="services"),
        ForbiddenError,
        (FORBIDDEN, "get on services/proxy", "'http:schedext:views'", "schedext-system",
         "ClusterRole schedext-viewer", "--clusterrole=schedext-viewer"),
    ),
    Case(
        "credentials refused",
        401,
        status(401, "Unauthorized", "Unauthorized"),
        ForbiddenError,
        ("did not accept your credentials",),
    ),
    Case(
        "the Service has no ready endpoint",
        503,
        status(503, "ServiceUnavailable", 'no endpoints available for service "schedext"'),
        UnreachableError,
        ("schedext is unreachable", "no ready endpoint", "'views'",
         "kubectl -n schedext-system get pods"),
    ),
    Case(
        "the endpoint refuses the connection",
        503,
        status(503, "ServiceUnavailable", "error trying to reach service: dial tcp "
               "192.0.2.7:9091: connect: connection refused"),
        UnreachableError,
        ("schedext is unreachable through the Service schedext-system/schedext",
         "connection refused", "--views-port"),
    ),
    Case(
        "no Service of that name",
        404,
        status(404, "NotFound", 'services "schedext" not found', name="schedext", kind="services"),
        UnreachableError,
        ("there is no Service schedext-system/schedext", "--schedext-namespace"),
    ),
    Case(
        "a Service without an Endpoints object",
        404,
        status(404, "NotFound", 'endpoints "schedext" not found', name="schedext",
               kind="endpoints"),
        UnreachableError,
        ("has no endpoints",),
    ),
    Case(
        "schedext does not know the pod",
        404,
        orjson.dumps({"Error": "pod team/job is unknown to schedext: not pending here, not bound"}),
        NotFoundError,
        ("pod team/job is unknown to schedext",),
    ),
    Case(
        "the port leads to the metrics listener, not the views",
        404,
        b"this port serves only /metrics and /healthz\n",
        UnreachableError,
        ("does not serve schedext's views", "this port serves only /metrics", "--views-port"),
    ),
    Case(
        "a proxy in between fails without a Status",
        502,
        b"Bad Gateway",
        UnreachableError,
        ("schedext is unreachable", "Bad Gateway"),
    ),
    Case(
        "schedext refuses a request",
        400,
        orjson.dumps({"Error": "not a pod: give /explain/NAMESPACE/NAME, Kubernetes names"}),
        AccessError,
        ("schedext answered: not a pod",),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_failure_of_the_service_proxy_says_what_happened(case: Case) -> None:
    error = failure(TARGET, case.status, case.body)
    assert type(error) is case.kind
    for fragment in case.says:
        assert fragment in str(error), f"{fragment!r} not in {error}"


def test_an_answer_of_200_is_no_failure() -> None:
    assert failure(TARGET, 200, b'{"nodes": []}') is None


def test_the_proxy_path_names_the_service_port_rbac_checks() -> None:
    target = Target(namespace="gpu-system", service="sx", port="views")
    assert target.proxy_name == "http:sx:views"
    assert target.path("/inventory") == (
        "/api/v1/namespaces/gpu-system/services/http:sx:views/proxy/inventory"
    )
    refused = failure(target, 403, status(403, "Forbidden", "forbidden"))
    assert "resource name 'http:sx:views', in the namespace gpu-system" in str(refused)
