"""Applying manifests/ to the real API server as kubectl would (server-side apply, strict
field validation), and credentials of a ServiceAccount as its pod would have them mounted:
shared by the manifest and mTLS end-to-end tests; the fault soak's replicas stand in pods
made here."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from testbed.controlplane import ControlPlane
from testbed.kubeapi import KubeApi

SYSTEM_NAMESPACE = "schedext-system"
# Namespaced objects without a namespace (the examples) are applied here, as kubectl would.
DEFAULT_NAMESPACE = "default"
FIELD_MANAGER = "schedext-e2e"


@contextlib.contextmanager
def kube_with_namespaces(
    control_plane: ControlPlane, namespaces: Iterable[dict[str, Any]]
) -> Iterator[Kube]:
    """A :class:`Kube` after applying ``namespaces`` for real: namespaced objects need them,
    and their Pod Security labels make the API server check pod templates against
    "restricted"."""
    client = Kube(control_plane)
    try:
        for namespace in namespaces:
            client.apply(namespace, dry_run=False)
        yield client
    finally:
        client.close()


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


class Kube:
    """Server-side apply through the API server, with the warnings it answers."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self._client = httpx.Client(
            base_url=control_plane.server,
            verify=ssl.create_default_context(cafile=str(control_plane.ca_cert)),
            headers={"Authorization": f"Bearer {control_plane.token}"},
            timeout=30,
        )
        self._resources: dict[str, list[dict[str, Any]]] = {}

    def close(self) -> None:
        self._client.close()

    def path(self, obj: dict[str, Any], namespace: str) -> str:
        """The object's URL, from API discovery (plural name, namespaced or not)."""
        api_version = obj["apiVersion"]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if base not in self._resources:
            answer = self._client.get(base)
            assert answer.status_code == 200, f"{base} is not served: {answer.text}"
            self._resources[base] = answer.json()["resources"]
        resource = next(
            (r for r in self._resources[base] if r["kind"] == obj["kind"] and "/" not in r["name"]),
            None,
        )
        assert resource is not None, f"{api_version} has no kind {obj['kind']}"
        name = obj["metadata"]["name"]
        if not resource["namespaced"]:
            assert "namespace" not in obj["metadata"], f"{obj['kind']} is cluster-scoped"
            return f"{base}/{resource['name']}/{name}"
        namespace = obj["metadata"].get("namespace", namespace)
        return f"{base}/namespaces/{namespace}/{resource['name']}/{name}"

    def apply(
        self, obj: dict[str, Any], *, dry_run: bool, namespace: str = DEFAULT_NAMESPACE
    ) -> tuple[dict[str, Any], list[str]]:
        """Server-side apply (as `kubectl apply --server-side --force-conflicts`); the object
        as stored (or as it would be) and the API server's warnings."""
        params = {"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        answer = self._client.patch(
            self.path(obj, namespace),
            content=json.dumps(obj),  # JSON is YAML
            headers={"Content-Type": "application/apply-patch+yaml"},
            params=params,
        )
        assert answer.status_code in (200, 201), f"HTTP {answer.status_code}: {answer.text}"
        result: dict[str, Any] = answer.json()
        return result, answer.headers.get_list("warning")


def service_account_kubeconfig(control_plane: ControlPlane, name: str, path: Path) -> Path:
    """A kubeconfig holding a fresh token of schedext-system/``name`` (TokenRequest), as the
    pod would have it mounted."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 3600}}  # fmt: skip
    token = control_plane.api.apply_raw(
        "POST", f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/{name}/token", request
    )["status"]["token"]
    ca_data = base64.b64encode(control_plane.ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": control_plane.server,
                                        "certificate-authority-data": ca_data}}
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }  # fmt: skip
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def stand_in_pod(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod object standing for the pod a schedext replica runs in (its POD_NAME): nothing
    runs it and no scheduler picks it up (a scheduler name nobody serves). It passes the
    "restricted" Pod Security Standard, which schedext-system may enforce."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "schedext", **(labels or {})},
        },
        "spec": {
            "schedulerName": "nobody",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "schedext",
                    "image": "registry.invalid/schedext:never-pulled",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def pod_labels(api: KubeApi, namespace: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = api.get_pod(namespace, name)["metadata"].get("labels") or {}
    return labels
