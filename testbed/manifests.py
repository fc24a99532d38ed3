"""Kubernetes objects as a test creates them through the API server: no kubelet or controller
runs them, so they are shaped to be observed (bound, listed, deleted at once), not run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]


def pod_manifest(
    name: str,
    *,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
    priority_class: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    image: str = "registry.invalid/pause:never-pulled",
) -> JSON:
    """A minimal single-container Pod. Nothing runs it (no kubelet), so the image is fake.

    terminationGracePeriodSeconds is 0 so that deleting the pod (also as a preemption victim)
    removes it at once instead of leaving it Terminating forever without a kubelet.
    """
    resources: JSON = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    spec: JSON = {
        "containers": [{"name": "main", "image": image, "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: JSON = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def statefulset_manifest(
    name: str,
    *,
    replicas: int,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    """A StatefulSet object selecting ``app: name``. No controller runs here: tests create its
    pods themselves (with ownerReferences to it)."""
    metadata: JSON = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/pause"}]},
            },
        },
    }
