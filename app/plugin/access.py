"""How ``kubectl schedext`` reaches schedext: through the API server's service proxy, with the
person's own credentials, to the Service's ``views`` port (schedext's ``--views-port``, which
serves the read-only views and nothing else). No port-forward: the API server connects to
the Service's endpoint, and RBAC decides who may (``get`` on ``services/proxy``, the
``schedext-viewer`` ClusterRole of manifests/viewer-rbac.yaml).

What can go wrong is decided from the answer alone (:func:`failure`), so that each case has a
sentence that says what to do, and no traceback reaches the person."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from app.kube.errors import ApiTransientError

if TYPE_CHECKING:  # aiohttp is loaded only when a request is made
    from app.kube.api import KubeApi

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "VIEWER_ROLE",
    "VIEWS_PORT",
    "AccessError",
    "ForbiddenError",
    "NotFoundError",
    "Target",
    "UnreachableError",
    "Views",
    "failure",
]

# What manifests/sidecar/deploy-sidecar.yaml and manifests/mtls/deploy-mtls.yaml install.
DEFAULT_NAMESPACE = "schedext-system"
DEFAULT_SERVICE = "schedext"
VIEWS_PORT = "views"  # the Service port's name: the views, plain HTTP
VIEWER_ROLE = "schedext-viewer"  # manifests/viewer-rbac.yaml


class AccessError(Exception):
    """schedext's views could not be read; the message says why and what to do."""


class UnreachableError(AccessError):
    """The API server cannot reach schedext (no endpoint, refused, not the views port)."""


class ForbiddenError(AccessError):
    """The person may not use the service proxy (or their credentials are refused)."""


class NotFoundError(AccessError):
    """schedext answered 404: it does not know what was asked (a pod)."""


@dataclass(frozen=True)
class Target:
    """Where schedext's views are: the Service and its port, as the service proxy names them."""

    namespace: str = DEFAULT_NAMESPACE
    service: str = DEFAULT_SERVICE
    port: str = VIEWS_PORT

    @property
    def proxy_name(self) -> str:
        """The name in the proxy URL, which RBAC checks against ``resourceNames``."""
        return f"http:{self.service}:{self.port}"

    def path(self, view: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{self.proxy_name}/proxy{view}"

    @property
    def service_key(self) -> str:
        return f"{self.namespace}/{self.service}"


def _document(body: bytes) -> dict[str, Any] | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return document if isinstance(document, dict) else None


def _is_status(document: dict[str, Any] | None) -> bool:
    """Whether the API server itself answered (a Status object), not schedext behind it."""
    return document is not None and document.get("kind") == "Status"


def failure(target: Target, status: int, body: bytes) -> AccessError | None:
    """What went wrong, from the status and body the service proxy answered; None for 200.

    Purely computational: the caller reads the answer and raises what this returns."""
    if status == 200:
        return None
    document = _document(body)
    if _is_status(document):
        assert document is not None
        return _api_server_failure(target, status, document)
    if document is not None and isinstance(document.get("Error"), str):
        error = document["Error"]
        return NotFoundError(error) if status == 404 else AccessError(f"schedext answered: {error}")
    text = body[:300].decode(errors="replace").strip()
    if status in (404, 405):
        # Not schedext's views: another listener behind the port (the metrics one, say).
        return UnreachableError(
            f"the port {target.port!r} of the Service {target.service_key} does not serve "
            f"schedext's views (it answered {status}: {text}). It must reach schedext's "
            "--views-port: see the Service in manifests/sidecar/deploy-sidecar.yaml"
        )
    if status in (502, 503, 504):
        return UnreachableError(f"schedext is unreachable through {target.service_key}: {text}")
    return AccessError(f"unexpected answer {status} through {target.service_key}: {text}")


def _api_server_failure(target: Target, status: int, document: dict[str, Any]) -> AccessError:
    message = str(document.get("message", "")).strip()
    if status == 401:
        return ForbiddenError(
            "the API server did not accept your credentials (401 Unauthorized): log in again, "
            "or check the user of your kubeconfig context"
        )
    if status == 403:
        return ForbiddenError(
            f"{message}\nkubectl schedext needs get on services/proxy, resource name "
            f"{target.proxy_name!r}, in the namespace {target.namespace}: ask for the "
            f"ClusterRole {VIEWER_ROLE} (manifests/viewer-rbac.yaml) bound to you there, e.g. "
            f"kubectl -n {target.namespace} create rolebinding schedext-viewer-$USER "
            f"--clusterrole={VIEWER_ROLE} --user=$USER"
        )
    details = document.get("details")
    kind = details.get("kind") if isinstance(details, dict) else None
    return _unreachable(target, status, message, kind) or AccessError(
        f"the API server answered {status}: {message}"
    )


def _unreachable(
    target: Target, status: int, message: str, kind: str | None
) -> UnreachableError | None:
    """The API server's answers that say it cannot reach schedext's views."""
    service = target.service_key
    if status == 404 and kind == "services":
        why = f"there is no Service {service}: is schedext installed there?"
        return UnreachableError(f"{why} (--schedext-namespace, --service)")
    if status == 404 and kind == "endpoints":
        return UnreachableError(
            f"schedext is unreachable: the Service {service} has no endpoints "
            "(no schedext pod has been ready behind it)"
        )
    if status == 503 and message.startswith("no endpoints available"):
        return UnreachableError(
            f"schedext is unreachable: the Service {service} has no ready endpoint with the "
            f"port {target.port!r}. Is schedext running and ready? kubectl -n "
            f"{target.namespace} get pods -l app.kubernetes.io/part-of=schedext"
        )
    if status in (502, 503, 504):
        return UnreachableError(
            f"schedext is unreachable through the Service {service}: {message}. Is schedext "
            f"running with --views-port, and does the Service's {target.port!r} port lead to it?"
        )
    return None


class Views:
    """schedext's read-only views, read through the API server's service proxy."""

    def __init__(self, api: KubeApi, target: Target, *, timeout: float) -> None:
        self._api = api
        self._target = target
        self._timeout = timeout

    async def get(self, view: str) -> dict[str, Any]:
        """The view's JSON document; raises AccessError."""
        try:
            status, body = await self._api.get_answer(
                self._target.path(view), timeout=self._timeout
            )
        except ApiTransientError as error:
            raise UnreachableError(f"cannot reach the API server: {error}") from None
        problem = failure(self._target, status, body)
        if problem is not None:
            raise problem
        document = _document(body)
        if document is None:
            raise AccessError(f"schedext's {view} answer is not a JSON object")
        return document

    async def pod_exists(self, namespace: str, name: str) -> bool | None:
        """Whether the API server has the pod; None when the person may not ask, or it
        cannot say (the question only sharpens a message)."""
        try:
            status, _ = await self._api.get_answer(
                f"/api/v1/namespaces/{namespace}/pods/{name}", timeout=self._timeout
            )
        except ApiTransientError:
            return None
        return {200: True, 404: False}.get(status)
