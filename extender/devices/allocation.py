"""Which GPUs the kubelet's device requests get: the pods on one node as the agent sees them
(:class:`NodePod`), and the matching of an ``Allocate`` or ``GetPreferredAllocation`` to the
pod schedext bound.

The kubelet does not say which pod a device request is for: ``Allocate`` carries only device
IDs. The agent therefore matches it to a pod bound to this node that has not been given its
GPUs yet, the oldest bind first, and answers with the GPUs schedext chose for that pod, not
those the kubelet named.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodePod"]


@dataclass(frozen=True, slots=True)
class NodePod:
    """A live pod on the agent's node that asks for the GPU resource."""

    uid: str
    namespace: str
    name: str
    gpus: int  # the GPU resource, summed over the pod's containers (init containers: max)
    # schedext.io/gpu-ids: the indices schedext chose; None when schedext did not bind it.
    gpu_ids: tuple[int, ...] | None = None
    # schedext.io/gpu-uuids: the same GPUs by UUID, when the node published UUIDs at bind.
    gpu_uuids: tuple[str, ...] | None = None
    # schedext.io/gpu-allocated: the UUIDs the agent already gave this pod's containers.
    allocated: tuple[str, ...] = ()
    # When it was bound (its PodScheduled condition's lastTransitionTime, Unix seconds; the
    # creation time when absent): the oldest bind is admitted first.
    bound_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
