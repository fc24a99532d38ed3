"""A pod object, as the node agent needs it: a :class:`NodePod` (what it asks for, whole GPUs
or a share of some, what schedext chose, what the agent already gave it).

It reads the pod as the extender reads a bound one (:func:`extender.requests.holding_from_pod`),
so that the agent and the extender never disagree on what a pod holds. That is why it lives
here and not in :mod:`extender.devices`: the node half's values sit below the model, the
requests above it, and a decoder that needs both stands above both."""

from __future__ import annotations

import datetime as dt

from extender import fields, names
from extender.config import ShareResources
from extender.devices.allocation import NodePod
from extender.devices.containers import granted_devices, parse_grants, pod_containers
from extender.fields import JSONObject
from extender.requests import holding_from_pod

__all__ = ["node_pod"]


_DEFAULT_SHARES = ShareResources()


def node_pod(
    pod: JSONObject,
    *,
    gpu_resource: str = names.GPU_RESOURCE,
    shares: ShareResources = _DEFAULT_SHARES,
) -> NodePod | None:
    """The pod as the agent's device plugins see it; None when it asks for no GPU, no share of
    one and no MIG device, or is done. Its containers and what each was given come with it
    (:mod:`extender.devices.containers`). A share is read as the extender reads a bound pod's:
    the bind's annotations (``schedext.io/gpu-share-memory-mib``, ``-cores``) first, else the
    ``shares`` resources it asks for."""
    holding = holding_from_pod(pod, gpu_resource=gpu_resource, shares=shares)
    if holding is None or (holding.devices <= 0 and not holding.mig):
        return None
    meta = fields.obj(pod, "metadata")
    annotations = fields.string_map(meta, "annotations")
    grants = parse_grants(annotations.get(names.GPU_ALLOCATED))
    return NodePod(
        uid=holding.uid,
        namespace=holding.namespace,
        name=holding.name,
        gpus=holding.gpus,
        gpu_ids=holding.gpu_ids,
        gpu_uuids=holding.gpu_uuids,
        allocated=granted_devices(grants),
        bound_at=_bound_at(pod),
        mig=holding.mig,
        mig_uuids=holding.mig_uuids,
        shares=holding.share.devices,
        share_memory_mib=holding.share.memory_mib,
        share_cores=holding.share.cores,
        containers=pod_containers(fields.obj(pod, "spec")),
        grants=grants,
    )


def _bound_at(pod: JSONObject) -> float:
    """When the Binding was written: the API server stamps the PodScheduled condition then
    (second precision); the creation time stands in where it is missing."""
    for condition in fields.objects(fields.obj(pod, "status"), "conditions"):
        if fields.text(condition, "type") == "PodScheduled":
            at = _time(fields.text(condition, "lastTransitionTime"))
            if at is not None:
                return at
    return _time(fields.text(fields.obj(pod, "metadata"), "creationTimestamp")) or 0.0


def _time(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
