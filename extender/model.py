"""Value types shared by the core: what a pod asks for, what a node has, who holds what."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import NamedTuple

from extender.choices import Choice
from extender.devices.document import UseSample
from extender.devices.drift import Drift
from extender.dra import DraGpus, FenceRule
from extender.verdicts import PRECEDENCE, RANKED, FilterVerdict, Reason, Rejection

# Reason, PRECEDENCE, RANKED, Rejection and FilterVerdict live in extender.verdicts; named here
# too, where their callers have long imported them from.
__all__ = [
    "NO_SHARE",
    "PRECEDENCE",
    "RANKED",
    "BindPlan",
    "ClaimPlan",
    "ClaimPolicy",
    "Demand",
    "Explanation",
    "FilterVerdict",
    "GpuInUse",
    "GpuShare",
    "GroupStatus",
    "Holding",
    "HoldingKind",
    "IPRequest",
    "MigSlot",
    "NodeExplanation",
    "NodeSpec",
    "PodRequest",
    "QuotaHold",
    "Reason",
    "Rejection",
    "Victim",
    "WorkloadClass",
]


class WorkloadClass(Enum):
    """The ``workload-type`` label: which kind of node a pod is meant for."""

    UNSPECIFIED = ""
    CPU_INTENSIVE = "CPU-intensive"
    GPU_INTENSIVE = "GPU-intensive"


class ClaimPolicy(Enum):
    """How long a StatefulSet pod's identity keeps its address (``schedext.io/ip-policy``)."""

    STICKY = "sticky"  # while the StatefulSet exists and the ordinal is below replicas
    NEVER_RELEASE = "never-release"  # until the IPClaim is deleted by a person


@dataclass(frozen=True, slots=True)
class IPRequest:
    """The address a pod asks for: a specific one, or any of some pools; sticky when the pod's
    StatefulSet identity (``sts/<namespace>/<name>/<ordinal>``) should keep it."""

    address: str | None = None
    pools: tuple[str, ...] = ()
    policy: ClaimPolicy | None = None
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A share of GPUs instead of whole ones: this much memory (MiB) and compute (percent of
    the SMs; 0: none asked) on each of ``devices`` distinct GPUs. :data:`NO_SHARE`: none."""

    devices: int = 0
    memory_mib: int = 0
    cores: int = 0

    def __bool__(self) -> bool:
        return self.devices > 0


NO_SHARE = GpuShare()


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """Who a pod is and what it takes from a node: the one value that a pending pod's
    :class:`PodRequest` and a placed pod's :class:`Holding` share. What it asks of each
    resource kind (:mod:`extender.kinds`) is one value per kind, declared here once and
    decoded once (:mod:`extender.requests`); a holding made from a request copies it whole
    (:meth:`Holding.placing`)."""

    uid: str
    namespace: str
    name: str
    # The kinds (a pod asks one at most): whole GPUs, how many; a share of some GPUs; MIG
    # devices per profile ("1g.10gb"; resource nvidia.com/mig-<profile>), sorted by profile.
    gpus: int = 0
    share: GpuShare = NO_SHARE
    mig: tuple[tuple[str, int], ...] = ()
    cpu_milli: int = 0
    memory_bytes: int = 0
    priority: int = 0
    # The pod's gang, "namespace/name" of its PodGroup, when it belongs to one.
    group: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def devices(self) -> int:
        """How many GPUs the pod takes something on: whole ones, or shares of distinct ones."""
        return self.gpus or self.share.devices


_DEMAND_FIELDS = tuple(f.name for f in fields(Demand))


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRequest(Demand):
    """What a pending pod needs from a node, decoded once from the pod object."""

    workload: WorkloadClass = WorkloadClass.UNSPECIFIED
    gpu_model: str | None = None
    gpu_memory_mib: int | None = None
    preempt_never: bool = False
    ip: IPRequest | None = None
    # Preferred affinities or a ScheduleAnyway topology spread: kube-scheduler's Score plugins
    # have something to weigh for this pod (extender.shortlist gives them a longer list).
    soft_preferences: bool = False
    # DRA (extender.dra_asks fills these at each verb from the claims ledger): the claims the
    # pod names ("namespace/name"), the GPUs they ask and do not hold yet, and whether a
    # DeviceClass serves its nvidia.com/gpu on nodes without it (KEP-5004).
    claims: tuple[str, ...] = ()
    dra_gpus: int = 0
    gpus_via_dra: bool = False
    # A gang member's topology annotations (schedext's, Kueue's, KAI's; extender.gang
    # .topology), as written: its group follows them where its PodGroup names none.
    topology: tuple[tuple[str, str], ...] = ()

    @property
    def dra_asks(self) -> int:
        """The GPUs the pod gets through DRA on a node DRA owns (0: none)."""
        return self.dra_gpus + (self.gpus if self.gpus_via_dra else 0)

    @property
    def needs_gpu_node(self) -> bool:
        """Whether only nodes with GPU hardware can host the pod."""
        return self.devices > 0 or bool(self.mig) or self.workload is WorkloadClass.GPU_INTENSIVE


class GpuInUse(NamedTuple):
    """A GPU the node agent reports in use by a container that schedext's placements do not
    account for (the kubelet's PodResources; extender.devices.drift): never free."""

    gpu: int  # its index
    pod: str  # namespace/name, as the kubelet names it
    why: str  # the sentence filter and explain show


class MigSlot(NamedTuple):
    """One MIG device of a node: the GPU it is on (NVML index), its profile and UUID."""

    gpu: int
    profile: str
    uuid: str


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """The facts about a node that scheduling decisions use (a node object, reduced)."""

    name: str
    uid: str = ""
    cpu_milli: int = 0
    memory_bytes: int = 0
    gpu_count: int = 0
    gpu_model: str | None = None
    gpu_memory_mib: int | None = None
    # NVLink/NUMA domains as tuples of GPU indices; empty when the node publishes none.
    gpu_groups: tuple[tuple[int, ...], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    # Why the node's topology annotation was ignored, if it was (shown by explain).
    topology_problem: str | None = None
    # From the node agent's topology document (version 2): each GPU's UUID by index (empty
    # when not published), and the GPUs it found unhealthy, with why.
    gpu_uuids: tuple[str, ...] = ()
    gpu_unhealthy: tuple[tuple[int, str], ...] = ()
    # On a node without nvidia.com/gpu (its GPUs are DRA's), the agent's NVLink/NUMA groups
    # by UUID: what DRA pods are rated by (extender.dra.capacity); empty elsewhere.
    gpu_links: tuple[tuple[str, ...], ...] = ()
    # The node agent's last sample of its GPUs' use (None: none published or unreadable).
    gpu_use: UseSample | None = None
    use_problem: str | None = None
    # MIG (NVIDIA's mixed strategy): the GPUs in MIG mode, by index, which ``gpu_count`` does
    # not count and nothing hands out whole; and their MIG devices (see extender.mig).
    gpu_mig: tuple[int, ...] = ()
    mig_slices: tuple[MigSlot, ...] = ()
    # The node agent's drift document (None: none published, or unreadable, and why): the
    # GPUs in use that schedext does not account for, by index (where the node publishes
    # UUIDs), and the MIG devices likewise, by UUID. Both are held: never handed out.
    drift: Drift | None = None
    drift_problem: str | None = None
    gpu_in_use: tuple[GpuInUse, ...] = ()
    mig_in_use: frozenset[str] = frozenset()
    # Of those, the GPUs DRA's claims hold only shares of (consumable capacity), with the
    # memory (MiB) the shares took: not free whole, but open to schedext's shares beside them.
    gpu_shared_outside: tuple[tuple[int, int], ...] = ()
    # The GPUs DRA hands out here and who owns the node's GPUs (extender.dra.capacity); None
    # on a node no GPU driver publishes slices for. Set by the claims ledger, not the watch.
    dra: DraGpus | None = None

    @property
    def gpu_healthy(self) -> int:
        """Whole GPUs the node agent has not marked unhealthy."""
        mig = set(self.gpu_mig)
        return self.gpu_count - sum(1 for index, _ in self.gpu_unhealthy if index not in mig)

    @property
    def gpu_indices(self) -> int:
        """How many GPU indices the node has: its whole GPUs and its GPUs in MIG mode."""
        return self.gpu_count + len(self.gpu_mig)


class HoldingKind(Enum):
    RESERVED = "reserved"  # chosen by our bind, not yet seen bound by the API server
    BOUND = "bound"  # the pod is bound to the node


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding(Demand):
    """Resources a pod holds on a node: a bound pod, or a reservation made by bind."""

    node: str
    kind: HoldingKind = HoldingKind.BOUND
    # The exact GPU indices, when known (from our annotation); None means "some gpus".
    gpu_ids: tuple[int, ...] | None = None
    # The same GPUs by UUID (schedext.io/gpu-uuids), when bind wrote them: they win over the
    # indices where the node publishes UUIDs.
    gpu_uuids: tuple[str, ...] | None = None
    # The MIG devices it holds, by UUID (schedext.io/mig-uuids), when bind wrote them.
    mig_uuids: tuple[str, ...] | None = None
    expires_at: float | None = None  # only reservations expire
    running: bool = False  # pod phase Running (PodGroup status counts it)
    ip: str | None = None  # the address it holds (schedext.io/ip), and its pool
    ip_pool: str | None = None

    @classmethod
    def placing(
        cls,
        demand: Demand,
        *,
        node: str,
        kind: HoldingKind,
        gpu_ids: tuple[int, ...],
        gpu_uuids: tuple[str, ...] | None = None,
        mig_uuids: tuple[str, ...] | None = None,
        expires_at: float | None = None,
        ip: str | None = None,
        ip_pool: str | None = None,
    ) -> Holding:
        """What ``demand`` holds once placed on ``node``: every field of :class:`Demand`
        carried over as it is, so that a new resource kind needs no line here."""
        return cls(
            **{name: getattr(demand, name) for name in _DEMAND_FIELDS},
            node=node,
            kind=kind,
            gpu_ids=gpu_ids,
            gpu_uuids=gpu_uuids,
            mig_uuids=mig_uuids,
            expires_at=expires_at,
            ip=ip,
            ip_pool=ip_pool,
        )


@dataclass(frozen=True, slots=True)
class BindPlan:
    """The effects bind must perform: bind ``uid`` to ``node`` with these annotations."""

    uid: str
    namespace: str
    name: str
    node: str
    gpu_ids: tuple[int, ...]
    annotations: Mapping[str, str]
    group: str | None = None  # the gang, whose barrier bind waits at
    ip: str | None = None
    ip_pool: str | None = None
    # A sticky address: the IPClaim to create (or to point at this pod) before the Binding.
    claim: ClaimPlan | None = None
    # Whether kube-scheduler chose a node schedext rated best (extender.choices).
    choice: Choice = Choice.UNSCORED
    # dra.fence: the DeviceTaintRules to publish before the Binding, so that DRA's allocator
    # cannot pick the pod's GPUs in between (extender.fencing).
    fence: tuple[FenceRule, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    name: str
    pool: str
    address: str
    owner: str
    policy: ClaimPolicy
    holder_uid: str
    exists: bool  # the identity already has this claim (update its holder, never delete it)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """What a PodGroup's status says (the fields scheduler-plugins keeps)."""

    phase: str  # Pending | PreScheduling | Scheduling | Scheduled | Running
    members: int
    scheduled: int  # bound members
    running: int
    waiting: int  # members holding a reservation at the bind barrier


@dataclass(frozen=True, slots=True)
class NodeExplanation:
    node: str
    fits: bool
    reason: str = ""
    resolvable: bool = False  # preemption could help on this node
    score: int | None = None  # a node it fits: prioritize's 0-10 for it, as schedext gives it
    # Where the kubelet and schedext disagree on the node (extender.devices.drift.describe).
    drift: tuple[str, ...] = ()
    # What DRA says of the node: its owner, the devices claims hold (extender.explain).
    dra: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaHold:
    """Which team quota holds a pending pod back, and by how much (see extender.quotas)."""

    quota: str  # the ElasticQuota, "namespace/name"
    resource: str  # as the quota names it ("nvidia.com/gpu")
    reason: Reason  # QUOTA_MAX or QUOTA_BORROW
    over_by: str  # how far the pod (or its gang) goes past what is allowed, in the resource's units
    message: str  # filter's message


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a pod fits, or does not fit, each node: what ``schedext explain`` shows."""

    pod: str
    uid: str
    state: str  # pending | reserved | bound
    node: str | None  # where it is bound or reserved
    request: Mapping[str, object]
    group: GroupStatus | None
    group_reason: str  # why the whole group holds the pod back, if it does
    nodes: tuple[NodeExplanation, ...]
    quota: QuotaHold | None = None  # the team quota that holds the pod back, if one does
    # The GPUs held for the pod's gang, in words, or why it has none ("" when neither is
    # known: no gang, or it has not waited long enough).
    group_hold: str = ""


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod kube-scheduler proposes to evict, as preempt receives it."""

    uid: str
