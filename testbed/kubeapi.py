"""A small synchronous REST client of kube-apiserver for tests and benchmarks: what they
create, read and wait for, kept apart from schedext's own client (app.kube) so that the code
under test never checks itself."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from testbed.waiting import wait_for

JSON = dict[str, Any]


class ApiError(RuntimeError):
    """kube-apiserver answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body

    def json(self) -> JSON:
        """The Status object kube-apiserver sent, or {} if the body was not JSON."""
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}


_RETRIES_ON_429 = 10


class KubeApi:
    """Small synchronous REST client for kube-apiserver: CA-verified TLS and a bearer token."""

    wait_for = staticmethod(wait_for)

    def __init__(self, server: str, token: str, ca_cert: Path, *, timeout: float = 10.0) -> None:
        # An SSLContext, not a CA path: httpx deprecates verify=<path>.
        context = ssl.create_default_context(cafile=str(ca_cert))
        self._client = httpx.Client(
            base_url=server,
            verify=context,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply_raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send any request; return the decoded JSON body ({} if empty). Non-2xx -> ApiError.

        For PATCH pass e.g. ``content_type="application/merge-patch+json"``.
        """
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        # 429 with Retry-After is the API server asking to come back: right after a CRD is
        # created or changed its storage is "(re)initializing" for a moment. Retried a few
        # times, as client-go does; anything else is the caller's to judge.
        for _ in range(_RETRIES_ON_429):
            resp = self._client.request(
                method, path, content=content, headers=headers, params=dict(params or {})
            )
            if resp.status_code != 429:
                break
            time.sleep(min(float(resp.headers.get("Retry-After") or 1), 5.0))
        if resp.status_code >= 300:
            raise ApiError(method, path, resp.status_code, resp.text)
        if not resp.content:
            return {}
        decoded = resp.json()
        return decoded if isinstance(decoded, dict) else {"value": decoded}

    def get_text(self, path: str) -> str:
        """GET a non-JSON endpoint such as /readyz or /version."""
        resp = self._client.get(path, headers={"Accept": "*/*"})
        if resp.status_code >= 300:
            raise ApiError("GET", path, resp.status_code, resp.text)
        return resp.text

    # --- namespaces -----------------------------------------------------------------------

    def create_namespace(self, name: str, *, labels: Mapping[str, str] | None = None) -> JSON:
        metadata: JSON = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        return self.apply_raw("POST", "/api/v1/namespaces", body)

    # --- nodes ----------------------------------------------------------------------------

    def create_node(
        self,
        name: str,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
        gpus: int = 0,
        gpu_resource: str = "nvidia.com/gpu",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        extended: Mapping[str, str] | None = None,
    ) -> JSON:
        """Create a schedulable Node with its status in one POST (no kubelet will report it).
        ``extended``: more resources in its capacity and allocatable (what a device plugin or
        the node agent advertises).

        The node registry keeps status on create; later status changes need PUT .../status.
        """
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        if gpus:
            resources[gpu_resource] = str(gpus)
        resources.update(extended or {})
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata: JSON = {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        }
        if annotations:
            metadata["annotations"] = dict(annotations)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": metadata,
            "spec": {"taints": [dict(t) for t in taints or []]},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node created by the e2e harness",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        }
        return self.apply_raw("POST", "/api/v1/nodes", node)

    def get_node(self, name: str) -> JSON:
        return self.apply_raw("GET", f"/api/v1/nodes/{name}")

    def delete_node(self, name: str, *, missing_ok: bool = True) -> None:
        self._delete(f"/api/v1/nodes/{name}", missing_ok=missing_ok)

    # --- pods -----------------------------------------------------------------------------

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> JSON:
        pod = {"apiVersion": "v1", "kind": "Pod", **manifest}
        return self.apply_raw("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def get_pod(self, namespace: str, name: str) -> JSON:
        return self.apply_raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def list_pods(self, namespace: str, label_selector: str | None = None) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[JSON] = self.apply_raw(
            "GET", f"/api/v1/namespaces/{namespace}/pods", params=params
        ).get("items", [])
        return items

    def delete_pod(self, namespace: str, name: str, *, missing_ok: bool = True) -> None:
        """Delete immediately (grace 0): without a kubelet a graceful delete never completes."""
        self._delete(f"/api/v1/namespaces/{namespace}/pods/{name}", missing_ok=missing_ok)

    def events_for(self, namespace: str, pod_name: str) -> list[JSON]:
        """core/v1 Events about a pod (Scheduled, FailedScheduling, Preempted...), oldest first."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name}"
        items: list[JSON] = self.apply_raw(
            "GET", f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": selector}
        ).get("items", [])

        def when(event: JSON) -> str:
            return str(
                event.get("lastTimestamp")
                or event.get("eventTime")
                or event.get("metadata", {}).get("creationTimestamp")
                or ""
            )

        return sorted(items, key=when)

    def wait_pod_bound(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """Wait until the scheduler bound the pod; return its spec.nodeName."""

        def node_name() -> str:
            return str(self.get_pod(namespace, name).get("spec", {}).get("nodeName") or "")

        try:
            return wait_for(node_name, timeout, 0.2, f"pod {namespace}/{name} not bound")
        except AssertionError as exc:
            # The scheduler's events say why (FailedScheduling: "0/3 nodes are available...").
            raise AssertionError(f"{exc}; events: {self._event_summary(namespace, name)}") from None

    def _event_summary(self, namespace: str, name: str) -> str:
        try:
            events = self.events_for(namespace, name)
        except (ApiError, httpx.HTTPError) as exc:
            return f"<events unavailable: {exc}>"
        return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events[-5:])

    def _delete(self, path: str, *, missing_ok: bool) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        try:
            self.apply_raw("DELETE", path, options)
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise
