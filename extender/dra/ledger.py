"""The claims ledger: per node, the GPUs DRA advertises and which of them claims hold, for whom.

schedext hands out GPUs through its own bind; with Dynamic Resource Allocation, kube-scheduler
hands out GPUs too, through ResourceClaims. If schedext did not see those, it would hand a
GPU out twice. This book is what it sees: fed the ResourceSlices of the configured GPU
drivers (default ``gpu.nvidia.com``), the ResourceClaims, the pods that name claims, the
DeviceClasses and the DeviceTaintRules, decoded by this package's decoders, it answers per
node (:meth:`ClaimsLedger.node`, a :class:`~extender.dra.node_view.NodeDra`) which devices
are advertised (UUID, PCIe root, memory, health), which are held (whole, or MiB per share),
charged to which pods and claims. A claim is charged to the pods its ``reservedFor`` names
and to the pods that name it (``spec.resourceClaims``, or KEP-5004's
``status.extendedResourceClaimStatus``).

Reads are lookups: each write rebuilds the summaries of the nodes it touched, and returns
their names (sorted), which is also what a wait for freed devices will need. Results of
drivers that are not GPU drivers are not this book's; results with ``adminAccess`` occupy
nothing.

Bad input never raises. An object that cannot be read (an unknown apiVersion, an attribute of
no known kind, a claim naming a device no slice has) is kept and reported by
:meth:`ClaimsLedger.problems`, with a reason the shell logs or turns into a Warning event.
Bounded: at most ``capacity`` objects of each kind; a new one past it is refused and
reported (the latest :data:`MAX_REFUSALS` refusals are remembered).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sized
from types import MappingProxyType
from typing import Final, NamedTuple

from extender import names
from extender.dra import api
from extender.dra.claims import Allocated, Claim
from extender.dra.class_book import ClassBook
from extender.dra.classes import DeviceClass
from extender.dra.device_index import DeviceIndex
from extender.dra.node_view import NodeDra, Result, summarize
from extender.dra.pod_claims import PodClaims
from extender.dra.slices import DeviceRef, ResourceSlice
from extender.dra.taint_rules import TaintRule

__all__ = ["DEFAULT_GPU_DRIVER", "MAX_REFUSALS", "ClaimsLedger", "Problem"]

DEFAULT_GPU_DRIVER: Final = names.DRA_GPU_DRIVER
MAX_REFUSALS: Final = 100
_UNPLACED: Final = ""  # the node of a result whose device no slice has and no node is named
_NOWHERE: Final = (
    "holds a device schedext places on no node: in no ResourceSlice, with no node named in "
    "the allocation, or on no one node"
)


class Problem(NamedTuple):
    kind: str  # ResourceSlice | ResourceClaim | DeviceClass | DeviceTaintRule | Pod
    key: str  # its name ("namespace/name" when namespaced; a pod's UID)
    reason: str


class ClaimsLedger:
    def __init__(
        self, *, gpu_drivers: Iterable[str] = (DEFAULT_GPU_DRIVER,), capacity: int = 100_000
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.gpu_drivers = frozenset(gpu_drivers)
        self._capacity = capacity
        self._index = DeviceIndex()
        self._claims: dict[str, Claim] = {}
        self._by_device: dict[DeviceRef, set[str]] = {}  # claim keys whose results name it
        self._placed: dict[str, frozenset[str]] = {}  # claim key -> nodes its results are on
        self._on_node: dict[str, set[str]] = {}  # node -> claim keys placed there
        self._pods: dict[str, PodClaims] = {}
        self._naming: dict[str, set[str]] = {}  # claim key -> UIDs of the pods naming it
        self._reserved: dict[str, set[str]] = {}  # pod UID -> claims reserved for it
        self._rules: dict[str, TaintRule] = {}
        self.rules = MappingProxyType(self._rules)  # read-only: the fence's diff reads them
        self.classes = ClassBook(self.gpu_drivers)  # which serves a resource, which are GPUs
        self._nodes: dict[str, NodeDra] = {}
        self._refused: OrderedDict[tuple[str, str], str] = OrderedDict()
        # GPUs the allocated claims of each namespace hold (team quotas), kept as claims
        # change; a KEP-5004 claim is not counted: its pod asks nvidia.com/gpu, counted so.
        self._namespace_gpus: dict[str, int] = {}

    def __len__(self) -> int:
        books = (self._index, self._claims, self._pods, self._rules, self.classes)
        return sum(len(book) for book in books)

    # -- writes: each returns the nodes whose summary it rebuilt --------------------------

    def upsert_slice(self, piece: ResourceSlice) -> tuple[str, ...]:
        """Keep a slice of a GPU driver, or one that could not be read (no driver); a slice
        of any other driver is not this book's."""
        if piece.driver and piece.driver not in self.gpu_drivers:
            return self.delete_slice(piece.name)
        if piece.name not in self._index and self._full("ResourceSlice", piece.name, self._index):
            return ()
        refs, nodes = self._index.put(piece)
        return self._moved(refs, nodes)

    def delete_slice(self, name: str) -> tuple[str, ...]:
        self._refused.pop(("ResourceSlice", name), None)
        refs, nodes = self._index.remove(name)
        return self._moved(refs, nodes)

    def upsert_claim(self, claim: Claim) -> tuple[str, ...]:
        return self._rebuild(self._put_claim(claim))

    def delete_claim(self, key: str) -> tuple[str, ...]:
        return self._rebuild(self._drop_claim(key))

    def upsert_pod(self, pod: PodClaims) -> tuple[str, ...]:
        """Keep which claims a pod names; a pod that names none is forgotten."""
        if not pod.keys:
            return self.delete_pod(pod.uid)
        if pod.uid not in self._pods and self._full("Pod", pod.uid, self._pods):
            return ()
        nodes = self._forget_pod(pod.uid)
        self._pods[pod.uid] = pod
        for key in pod.keys:
            self._naming.setdefault(key, set()).add(pod.uid)
            nodes |= self._placed.get(key, frozenset())
        return self._rebuild(nodes)

    def delete_pod(self, uid: str) -> tuple[str, ...]:
        self._refused.pop(("Pod", uid), None)
        return self._rebuild(self._forget_pod(uid))

    def keep_pods(self, live: set[str]) -> tuple[str, ...]:
        """Forget the pods not in ``live`` (a pod relist's UIDs)."""
        return _touched([self.delete_pod(uid) for uid in sorted(set(self._pods) - live)])

    def upsert_taint_rule(self, rule: TaintRule) -> tuple[str, ...]:
        if rule.name not in self._rules and self._full("DeviceTaintRule", rule.name, self._rules):
            return ()
        old = self._rules.get(rule.name)
        self._rules[rule.name] = rule
        nodes = self._index.matching(rule)
        return self._rebuild(nodes | (self._index.matching(old) if old else set()))

    def delete_taint_rule(self, name: str) -> tuple[str, ...]:
        self._refused.pop(("DeviceTaintRule", name), None)
        old = self._rules.pop(name, None)
        return self._rebuild(self._index.matching(old) if old else set())

    def upsert_device_class(self, device_class: DeviceClass) -> None:
        name = device_class.name
        if name not in self.classes and self._full("DeviceClass", name, self.classes):
            return
        self.classes.put(device_class)

    def delete_device_class(self, name: str) -> None:
        self._refused.pop(("DeviceClass", name), None)
        self.classes.remove(name)

    # -- relists: each makes one kind exactly what a full list gave -----------------------

    def replace_slices(self, pieces: Iterable[ResourceSlice]) -> tuple[str, ...]:
        pieces = list(pieces)
        gone = {s.name for s in self._index.slices()} - {p.name for p in pieces}
        return _touched(
            [self.delete_slice(name) for name in sorted(gone)]
            + [self.upsert_slice(piece) for piece in pieces]
        )

    def replace_claims(self, claims: Iterable[Claim]) -> tuple[str, ...]:
        """Each node touched is rebuilt once, however many of its claims the list brings."""
        claims = list(claims)
        nodes: set[str] = set()
        for key in sorted(set(self._claims) - {c.key for c in claims}):
            nodes |= self._drop_claim(key)
        for claim in claims:
            nodes |= self._put_claim(claim)
        return self._rebuild(nodes)

    def replace_taint_rules(self, rules: Iterable[TaintRule]) -> tuple[str, ...]:
        rules = list(rules)
        gone = set(self._rules) - {r.name for r in rules}
        return _touched(
            [self.delete_taint_rule(name) for name in sorted(gone)]
            + [self.upsert_taint_rule(rule) for rule in rules]
        )

    def replace_device_classes(self, classes: Iterable[DeviceClass]) -> None:
        classes = list(classes)
        for name in sorted({c.name for c in self.classes} - {c.name for c in classes}):
            self.delete_device_class(name)
        for device_class in classes:
            self.upsert_device_class(device_class)

    # -- reads -----------------------------------------------------------------------------

    def node(self, name: str) -> NodeDra:
        """What DRA says of ``name`` (empty when nothing: a node DRA does not know)."""
        return self._nodes.get(name) or NodeDra(name)

    def node_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._nodes))

    def claim(self, key: str) -> Claim | None:
        return self._claims.get(key)

    def knows_pod(self, uid: str) -> bool:
        """Whether the book keeps pod ``uid`` (it names a claim, or a claim serves it)."""
        return uid in self._pods

    def pod_key(self, uid: str) -> str:
        """The "namespace/name" of a pod that names a claim (or a claim serves), by UID; ""
        for a pod the book has not seen."""
        pod = self._pods.get(uid)
        return f"{pod.namespace}/{pod.name}" if pod is not None else ""

    def claims_of(self, uid: str) -> tuple[str, ...]:
        """The claims a pod uses: those it names, and those reserved for it. Sorted."""
        pod = self._pods.get(uid)
        return tuple(sorted(set(pod.keys if pod else ()) | self._reserved.get(uid, set())))

    def namespace_gpus(self, namespace: str) -> int:
        """The GPUs (devices of a GPU driver) the namespace's allocated claims hold, but for
        those kube-scheduler made for a pod's extended resource: a lookup."""
        return self._namespace_gpus.get(namespace, 0)

    def asked_gpus(self, keys: Iterable[str]) -> int:
        """How many GPUs the claims ``keys`` ("namespace/name") ask and do not hold yet: the
        requests of a class that selects a GPU driver (or is named after one), of the claims
        not allocated. A claim not seen yet, or a class unknown, asks nothing known."""
        asked = 0
        for key in keys:
            claim = self._claims.get(key)
            if claim is None or claim.allocated:
                continue
            asked += sum(
                item.count for item in claim.asked if self.classes.gpu_class(item.device_class)
            )
        return asked

    def problems(self) -> tuple[Problem, ...]:
        """Everything the book could not read, or had to refuse, with why. Sorted; a pass
        over the book, for the shell to log and count, not for the verbs."""
        found = {Problem(kind, key, why) for (kind, key), why in self._refused.items()}
        for piece in self._index.slices():
            found.update(_slice_problems(piece))
        for key, claim in self._claims.items():
            if claim.problem:
                found.add(Problem("ResourceClaim", key, claim.problem))
            if _UNPLACED in self._placed.get(key, ()):
                found.add(Problem("ResourceClaim", key, _NOWHERE))
        for summary in self._nodes.values():  # a device no slice has (an unreadable one
            for held in summary.unknown:  # is its slice's problem)
                if self._index.get(held.ref) is None:
                    found.update(Problem("ResourceClaim", c, held.unknown) for c in held.claims)
        for kind, book in (
            ("DeviceTaintRule", self._rules.values()),
            ("DeviceClass", self.classes),
        ):
            found.update(Problem(kind, v.name, v.problem) for v in book if v.problem)
        return tuple(sorted(found))

    # -- the indexes -----------------------------------------------------------------------

    def _results(self, claim: Claim) -> Iterable[Allocated]:
        """The results that occupy a GPU driver's device."""
        return claim.occupying(self.gpu_drivers)

    def _put_claim(self, claim: Claim) -> set[str]:
        """Index ``claim``; the nodes whose summaries must be rebuilt."""
        key = claim.key
        if key not in self._claims and self._full("ResourceClaim", key, self._claims):
            return set()
        self._unindex(key)
        self._claims[key] = claim
        _tally(self._namespace_gpus, claim, sum(1 for r in self._results(claim)))
        for result in self._results(claim):
            self._by_device.setdefault(result.ref, set()).add(key)
        for uid in claim.pods:
            self._reserved.setdefault(uid, set()).add(key)
        return self._place(key)

    def _drop_claim(self, key: str) -> set[str]:
        self._refused.pop(("ResourceClaim", key), None)
        self._unindex(key)
        return self._place(key)

    def _unindex(self, key: str) -> None:
        claim = self._claims.pop(key, None)
        if claim is None:
            return
        _tally(self._namespace_gpus, claim, -len(list(self._results(claim))))
        for result in self._results(claim):
            api.discard(self._by_device, result.ref, key)
        for uid in claim.pods:
            api.discard(self._reserved, uid, key)

    def _forget_pod(self, uid: str) -> set[str]:
        pod = self._pods.pop(uid, None)
        nodes: set[str] = set()
        for key in pod.keys if pod else ():
            api.discard(self._naming, key, uid)
            nodes |= self._placed.get(key, frozenset())
        return nodes

    def _place(self, key: str) -> set[str]:
        """Put the claim on the nodes of the devices its results name (a device no slice
        has: on the node its allocation names); the nodes it left and joined."""
        old = self._placed.pop(key, frozenset())
        for node in old:
            api.discard(self._on_node, node, key)
        claim = self._claims.get(key)
        new = set()
        if claim is not None:
            for result in self._results(claim):
                device = self._index.get(result.ref)
                new.add(device.node if device else claim.node)
        for node in new:
            self._on_node.setdefault(node, set()).add(key)
        if new:
            self._placed[key] = frozenset(new)
        return set(old) | new

    def _moved(self, refs: set[DeviceRef], nodes: set[str]) -> tuple[str, ...]:
        """Devices changed: the claims naming them move, and the nodes on both ends rebuild."""
        keys = set().union(*(self._by_device.get(ref, ()) for ref in refs))
        for key in keys:
            nodes |= self._place(key)
        return self._rebuild(nodes)

    def _rebuild(self, nodes: Iterable[str]) -> tuple[str, ...]:
        rebuilt = tuple(sorted(set(nodes) - {_UNPLACED}))
        rules = tuple(self._rules[name] for name in sorted(self._rules))
        for node in rebuilt:
            results = []
            for key in self._on_node.get(node, ()):
                claim = self._claims[key]
                pods = tuple(sorted(set(claim.pods) | self._naming.get(key, set())))
                for result in self._results(claim):
                    device = self._index.get(result.ref)
                    if (device.node if device else claim.node) == node:
                        results.append(Result(key, pods, result, device))
            drivers = self._index.drivers(node)
            devices = self._index.on(node)
            if drivers or results:
                self._nodes[node] = summarize(
                    node, drivers=drivers, devices=devices, rules=rules, results=results
                )
            else:
                self._nodes.pop(node, None)
        return rebuilt

    def _full(self, kind: str, key: str, book: Sized) -> bool:
        """Whether ``book`` is at capacity: then the new ``key`` is refused, and remembered
        until it is kept or deleted."""
        if len(book) < self._capacity:
            self._refused.pop((kind, key), None)
            return False
        self._refused[(kind, key)] = f"refused: the book holds {self._capacity} of its kind"
        self._refused.move_to_end((kind, key))
        while len(self._refused) > MAX_REFUSALS:
            self._refused.popitem(last=False)
        return True


def _slice_problems(piece: ResourceSlice) -> Iterable[Problem]:
    if piece.problem:
        yield Problem("ResourceSlice", piece.name, piece.problem)
    for device in piece.devices:
        if device.problem:
            yield Problem("ResourceSlice", piece.name, f"device {device.name!r}: {device.problem}")
        elif not device.node:
            yield Problem("ResourceSlice", piece.name, f"device {device.name!r} is on no one node")


def _touched(writes: list[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(sorted({node for nodes in writes for node in nodes}))


def _tally(book: dict[str, int], claim: Claim, gpus: int) -> None:
    """Add ``gpus`` to what the claim's namespace holds (a KEP-5004 claim: its pod counts)."""
    if claim.extended or not gpus:
        return
    total = book.get(claim.namespace, 0) + gpus
    if total:
        book[claim.namespace] = total
    else:
        book.pop(claim.namespace, None)
