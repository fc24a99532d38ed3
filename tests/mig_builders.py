"""Builders for MIG: a node whose agent published GPUs in MIG mode with their MIG devices,
and pods that ask for (or, bound, hold) MIG devices.

``mig_node("n", whole=1, migs={0: ["1g.10gb", "1g.10gb", "2g.20gb"]})``: GPU 0 in MIG mode
with three MIG devices, GPU 1 whole; allocatable ``nvidia.com/gpu`` counts 1, as NVIDIA's
"mixed" strategy (and schedext's agent) advertise it.
``mig_pod("p", {"1g.10gb": 2}, node="n", mig_uuids=[mig_uuid("n", 0, 0), ...])``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extender import names
from extender.devices import Gpu, GpuHealth, MigSlice, Topology, encode_topology
from testbed.builders import make_node, make_pod


def mig_uuid(node: str, gpu: int, mig: int) -> str:
    return f"MIG-{node}-{gpu}-{mig}"


def gpu_uuid(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}"


def mig_topology(
    node: str,
    migs: Mapping[int, Sequence[str]],
    gpus: int,
    *,
    unhealthy: Mapping[int, str] | None = None,
) -> str:
    """The agent's topology document: ``gpus`` GPUs by index, those in ``migs`` in MIG mode
    with MIG devices of these profiles (UUIDs from :func:`mig_uuid`)."""
    bad = unhealthy or {}
    return encode_topology(
        Topology(
            gpus=tuple(
                Gpu(
                    index=i,
                    uuid=gpu_uuid(node, i),
                    mig_enabled=i in migs,
                    health=GpuHealth(False, bad[i]) if i in bad else GpuHealth(),
                    migs=tuple(
                        MigSlice(profile, mig_uuid(node, i, m))
                        for m, profile in enumerate(migs.get(i, ()))
                    ),
                )
                for i in range(gpus)
            )
        )
    )


def mig_node(
    name: str,
    *,
    whole: int = 0,
    migs: Mapping[int, Sequence[str]],
    unhealthy: Mapping[int, str] | None = None,
    allocatable: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A node with ``whole`` whole GPUs and the GPUs in ``migs`` (indices) in MIG mode.
    ``allocatable``: the whole-GPU resource's count, ``whole`` by default (mixed strategy)."""
    gpus = whole + len(migs)
    annotations = {names.GPU_TOPOLOGY: mig_topology(name, migs, gpus, unhealthy=unhealthy)}
    count = whole if allocatable is None else allocatable
    node = make_node(name, gpus=count, annotations=annotations, **kwargs)
    if not count:  # a node with only MIG GPUs is a GPU node all the same
        node["metadata"]["labels"][names.GPU_PRODUCT_LABEL] = "NVIDIA-H100-80GB-HBM3"
    return node


def mig_pod(
    name: str = "mig",
    profiles: Mapping[str, int | str] | None = None,
    *,
    mig_uuids: Sequence[str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A pod asking for ``profiles`` ({"1g.10gb": 1} by default) as nvidia.com/mig-*
    resources; with ``node`` and ``mig_uuids``, bound as schedext's bind writes it."""
    pod = make_pod(name, **kwargs)
    resources = pod["spec"]["containers"][0]["resources"]
    for profile, count in (profiles or {"1g.10gb": 1}).items():
        resources["limits"][names.MIG_RESOURCE_PREFIX + profile] = str(count)
        resources["requests"][names.MIG_RESOURCE_PREFIX + profile] = str(count)
    if mig_uuids is not None:
        pod["metadata"]["annotations"][names.MIG_UUIDS] = ",".join(mig_uuids)
    return pod
