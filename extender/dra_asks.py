"""What a pending pod asks of DRA, read at each verb from the claims ledger: the GPUs its
claims ask, and whether its ``nvidia.com/gpu`` goes through DRA on nodes DRA owns; and what
a namespace's claims hold, for its team quota (:func:`claimed_use`).

A pod's own object says which claims it names (:attr:`PodRequest.claims`), not what they
ask: that is in the claims, which the ledger holds and which change apart from the pod (a
template's claim is made after the pod). So the request is decoded once and these fields are
filled per verb, from the ledger as it is then: a lookup per claim, and nothing at all for
the pods that name none on a cluster with no DeviceClass serving ``nvidia.com/gpu``.

Once kube-scheduler has allocated a pod's claims (in PreBind, before it calls bind), they ask
nothing more and the namespace's use counts what they hold: the quota still weighs them as
the pod's own (:func:`held_for`).
"""

from __future__ import annotations

import dataclasses

from extender.dra import ClaimsLedger
from extender.model import PodRequest
from extender.tally import Amounts

__all__ = ["claimed_use", "held_for", "with_dra"]


def with_dra(request: PodRequest, ledger: ClaimsLedger, gpu_resource: str) -> PodRequest:
    """``request`` with ``dra_gpus`` and ``gpus_via_dra`` as the ledger says now."""
    dra_gpus = ledger.asked_gpus(request.claims) if request.claims else 0
    via = request.gpus > 0 and ledger.classes.serves_gpus(gpu_resource)
    if (dra_gpus, via) == (request.dra_gpus, request.gpus_via_dra):
        return request
    return dataclasses.replace(request, dra_gpus=dra_gpus, gpus_via_dra=via)


def claimed_use(use: Amounts, ledger: ClaimsLedger, namespace: str) -> Amounts:
    """``use`` (what the namespace's pods hold) with the GPUs its claims hold beside: what
    its quota counts. A claim kube-scheduler made for a pod's ``nvidia.com/gpu`` is counted
    with the pod, once."""
    claimed = ledger.namespace_gpus(namespace)
    return use._replace(gpus=use.gpus + claimed) if claimed else use


def held_for(request: PodRequest, ledger: ClaimsLedger) -> int:
    """The GPUs the pod's allocated claims hold for it alone (reserved for no other pod), as
    :func:`claimed_use` counts them: a claim kube-scheduler made for a pod's extended
    resource is not, its pod's ``nvidia.com/gpu`` is."""
    held = 0
    for key in request.claims:
        claim = ledger.claim(key)
        if claim is not None and not claim.extended and set(claim.pods) <= {request.uid}:
            held += len(claim.occupying(ledger.gpu_drivers))
    return held
