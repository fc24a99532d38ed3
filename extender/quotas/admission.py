"""Whether a pod (or its gang, whole) may take what it asks for from its namespace's quota.

For each kind the quota names, with ``used`` what the namespace holds now and ``asked`` what
the pod (or every unplaced member its gang still needs) takes:

1. **max**: ``used + asked`` over max is refused (``QUOTA_MAX``).
2. **borrowing** (``used + asked`` over min), capacity scheduling's rule: only while the use
   of every namespace whose quota names the kind, plus ``asked``, stays within the sum of
   their mins (``QUOTA_BORROW``).
3. **weighted borrowing**: the borrowable amount ``B`` is the sum of mins less the use within
   mins (``sum(min(used_n, min_n))``): the guarantees lying idle. The namespaces that *want*
   to borrow are the pod's own and those whose use plus pending pods goes over their min.
   Each is entitled to ``B * weight / sum(weights of those wanting)`` (weight: the quota's
   ``schedext.io/borrow-weight``, else its min of the kind). A namespace that would borrow
   more than its entitlement is refused while another wanting namespace borrows less than
   its own; once every other one has its entitlement (or none wants), the rest of ``B`` goes
   first come, first served, as rule 2 bounds it. With a total weight of 0 no entitlement
   applies.

Only the kinds a quota names count for it, and only the quotas that state a min for a kind take
part in rules 2 and 3 for it (a kind named in max alone is a plain ceiling). A pod of a
namespace without a quota is never refused here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from extender.model import QuotaHold, Reason
from extender.quotas.book import QuotaBook
from extender.quotas.spec import Limit, QuotaSpec, show_amount
from extender.tally import ZERO, Amounts

__all__ = ["admit"]

# What a namespace holds now, or what its pending pods ask for.
Use = Callable[[str], Amounts]


def admit(
    book: QuotaBook, namespace: str, asked: Sequence[Amounts], *, used: Use, wanted: Use
) -> QuotaHold | None:
    """Why the pods ``asked`` (a pod, or the members its gang still needs) may not take what
    they ask from ``namespace``'s quota; None when they may."""
    spec = book.applying(namespace) if len(book) else None
    if spec is None:
        return None
    total = ZERO
    for amounts in asked:
        total = total.plus(amounts)
    own = used(namespace)
    for limit in spec.limits:
        need = total[limit.kind]
        if not need:
            continue
        after = own[limit.kind] + need
        if limit.max is not None and after > limit.max:
            return _hold(
                spec, limit, Reason.QUOTA_MAX, after - limit.max,
                f"{_show(spec, limit, after)} of max {_show(spec, limit, limit.max)} "
                f"{limit.resource}",
            )  # fmt: skip
        if limit.guarantees and after > limit.min:
            hold = _borrow(book, spec, limit, need, used=used, wanted=wanted)
            if hold is not None:
                return hold
    return None


def _borrow(
    book: QuotaBook, spec: QuotaSpec, limit: Limit, need: int, *, used: Use, wanted: Use
) -> QuotaHold | None:
    kind = limit.kind
    peers = book.guarantors(kind)
    mins = sum(q_limit.min for _, q_limit in peers)
    uses = {q.namespace: used(q.namespace)[kind] for q, _ in peers}
    aggregate = sum(uses.values())
    if aggregate + need > mins:
        return _hold(
            spec, limit, Reason.QUOTA_BORROW, aggregate + need - mins,
            f"over min {_show(spec, limit, limit.min)} {limit.resource}, and borrowing would "
            f"bring the quotas' use to {_show(spec, limit, aggregate + need)} of their summed "
            f"min {_show(spec, limit, mins)}",
        )  # fmt: skip
    borrowable = mins - sum(min(uses[q.namespace], q_limit.min) for q, q_limit in peers)
    wanting = [
        (q, q_limit)
        for q, q_limit in peers
        if q.namespace == spec.namespace
        or uses[q.namespace] + wanted(q.namespace)[kind] > q_limit.min
    ]
    weights = sum(q.weight(q_limit) for q, q_limit in wanting)
    if len(wanting) < 2 or weights <= 0:
        return None
    mine = uses[spec.namespace] + need - limit.min  # what it would borrow
    # Entitlement comparisons in integers: borrowed * weights against borrowable * weight.
    if mine * weights <= borrowable * spec.weight(limit):
        return None
    short = [
        q
        for q, q_limit in wanting
        if q.namespace != spec.namespace
        and max(0, uses[q.namespace] - q_limit.min) * weights < borrowable * q.weight(q_limit)
    ]
    if not short:
        return None
    entitled = borrowable * spec.weight(limit) // weights
    others = ", ".join(q.namespace for q in short)
    verb = "borrows less than its" if len(short) == 1 else "borrow less than their"
    return _hold(
        spec, limit, Reason.QUOTA_BORROW, mine - entitled,
        f"over min {_show(spec, limit, limit.min)} {limit.resource}, borrowing "
        f"{_show(spec, limit, mine)} is over its weighted share {_show(spec, limit, entitled)} "
        f"of {_show(spec, limit, borrowable)} idle while {others} {verb} share",
    )  # fmt: skip


def _hold(spec: QuotaSpec, limit: Limit, reason: Reason, over: int, what: str) -> QuotaHold:
    return QuotaHold(
        quota=spec.key,
        resource=limit.resource,
        reason=reason,
        over_by=_show(spec, limit, over),
        message=f"schedext: quota {spec.namespace}: {what}",
    )


def _show(spec: QuotaSpec, limit: Limit, value: int) -> str:
    return show_amount(limit.kind, value, spec.share_unit_mib)
