"""Team quotas: scheduler-plugins' ElasticQuota (one per namespace: ``min``, a guarantee;
``max``, a ceiling), borrowing what other teams leave idle, and taking it back through
preemption.

* :mod:`~extender.quotas.spec`: an ElasticQuota decoded into a :class:`QuotaSpec`, or refused
  with a :class:`QuotaError` (min over max, a negative or unreadable quantity, a resource
  schedext does not count). What is counted: whole GPUs, GPU shares' memory and cores, CPU and
  memory, each only for the quotas that name it. MIG devices are not counted.
* :mod:`~extender.quotas.book`: the quotas by namespace; with two in one namespace, the
  oldest applies and the others are reported as shadowed.
* :mod:`~extender.quotas.admission`: filter's (and bind's) question, whether a pod, or the
  members its gang still needs together, may take what it asks: max; borrowing within the sum
  of mins; borrowing shared by weight between the namespaces that want to borrow.
* :mod:`~extender.quotas.reclaim`: preempt's rule: within-min namespaces are never victims of
  another namespace's preemptor; a preemptor within its min takes from borrowers first.
* :mod:`~extender.quotas.departures`: the victims preempt approved that may be leaving, so
  that the victim rule does not count them twice while the watch lags.

What a namespace uses is what its pods hold, bound or reserved by bind, from the reservation
until the pod is gone (``Inventory.namespace_use``, kept as holdings change); what it wants,
what its pending pods ask (``PendingPods.wanted``).
"""

from extender.quotas.admission import admit
from extender.quotas.book import QuotaBook, Shadowed
from extender.quotas.departures import Departures
from extender.quotas.reclaim import VictimRule, victim_rule
from extender.quotas.spec import Kind, Limit, QuotaError, QuotaSpec, quota_spec, used_quantities

__all__ = [
    "Departures",
    "Kind",
    "Limit",
    "QuotaBook",
    "QuotaError",
    "QuotaSpec",
    "Shadowed",
    "VictimRule",
    "admit",
    "quota_spec",
    "used_quantities",
    "victim_rule",
]
