"""The fence's writes (``dra.fence``): the DeviceTaintRules that keep DRA's allocator off the
GPUs schedext binds on a node both the device plugin and DRA offer (extender.fencing says
which).

* Before a Binding: :meth:`Fences.before_bind` publishes the rules the bind's plan names, so
  that DRA cannot allocate the pod's GPUs between the Binding and the next pass; a rule that
  cannot be published refuses the bind (:class:`~app.kube.binding.BindError`: the Binding was
  never sent, the reservation goes back).
* Level-based: :meth:`Fences.pass_once`, run every second by :meth:`Fences.run_forever` while
  this replica is ready (synced, and the leader), and soon after a pod or a slice changes
  (:meth:`Fences.kick`), creates what is missing, rewrites what changed and deletes the rules
  of GPUs no pod of schedext's holds any more (the pod deleted or finished, the bind
  aborted). At most ``max_writes`` writes per pass.
* At start: :func:`fence_problem` says why the fence cannot work on this cluster (the API not
  served, or no right to write it), so that schedext refuses to start rather than let DRA
  hand out a GPU twice.

A bind's writes and a pass's take one lock, a write at a time: a pass deletes a rule only if
no bind has reserved its GPU since the pass was planned, and a bind's rule is never deleted
by a pass that planned before the bind's reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from app.kube.api import Deadline, KubeApi
from app.kube.binding import BindError
from app.kube.errors import ApiConflictError, ApiError, ApiNotFoundError
from app.kube.readiness import Readiness
from extender.dra import MANAGED_BY, FenceRule
from extender.fencing import FencePlan
from extender.model import BindPlan
from extender.scheduler import Scheduler

__all__ = ["DEVICE_TAINT_RULES", "Fences", "fence_problem", "rule_body"]

log = logging.getLogger("schedext.fence")

API_VERSION: Final = "resource.k8s.io/v1beta2"  # DeviceTaintRule's only version in v1.36
DEVICE_TAINT_RULES: Final = f"/apis/{API_VERSION}/devicetaintrules"
NODE_ANNOTATION: Final = "schedext.io/node"  # the node of the fenced device (for people)
GATE_HINT: Final = (
    "DeviceTaintRule is beta and off by default in Kubernetes v1.36: start kube-apiserver "
    "with --runtime-config=resource.k8s.io/v1beta2=true and the DRADeviceTaintRules feature "
    "gate on kube-apiserver, kube-scheduler and kube-controller-manager"
)
RBAC_HINT: Final = (
    "apply manifests/rbac-dra-fence.yaml, or install the chart with schedext.config.dra.fence"
)


def rule_spec(rule: FenceRule) -> dict[str, Any]:
    driver, pool, device = rule.ref
    taint = rule.taint
    return {
        "deviceSelector": {"driver": driver, "pool": pool, "device": device},
        "taint": {"key": taint.key, "value": taint.value, "effect": taint.effect},
    }


def rule_body(rule: FenceRule) -> dict[str, Any]:
    """The DeviceTaintRule that publishes ``rule``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": {MANAGED_BY: "schedext"},
            "annotations": {NODE_ANNOTATION: rule.node},
        },
        "spec": rule_spec(rule),
    }


class Fences:
    def __init__(self, api: KubeApi, *, max_writes: int = 64, call_timeout_s: float = 5.0) -> None:
        self._api = api
        self._max_writes = max_writes
        self._call_timeout_s = call_timeout_s
        self._lock = asyncio.Lock()
        self._kicked = asyncio.Event()
        # Why a plan's GPUs are in use outside schedext now (the scheduler's, once the pass
        # runs: Scheduler.dra_clash); None: not known yet.
        self._clash: Callable[[BindPlan], str] | None = None

    # ------------------------------------------------------------------- a bind's rules

    async def before_bind(
        self, rules: Iterable[FenceRule], deadline: Deadline, *, plan: BindPlan | None = None
    ) -> None:
        """Publish ``rules`` (a bind's) within ``deadline``; raises BindError when one cannot
        be (the caller's deadline running out raises TimeoutError), or when, once they are up,
        a claim turns out to hold one of ``plan``'s GPUs: DRA allocated it while the fence went
        up (the watch brings that in while the writes are awaited), and the bind must not
        hand it out again."""
        for rule in rules:
            async with self._lock:
                try:
                    await self._publish(rule, timeout=deadline.left())
                except ApiError as error:
                    raise BindError(
                        f"cannot fence GPU device {rule.ref} on node {rule.node} from DRA "
                        f"(DeviceTaintRule {rule.name}): {error}; not binding, so that DRA "
                        "cannot allocate it too"
                    ) from None
        taken = self._clash(plan) if plan is not None and self._clash is not None else ""
        if taken:
            raise BindError(
                f"pod {plan.key if plan else ''}: DRA allocated a GPU bind chose while its "
                f"fence went up ({taken}); not binding, kube-scheduler will retry"
            )

    # ------------------------------------------------------------------------ the passes

    def kick(self) -> None:
        """Something the fence follows changed (a pod, a slice): pass soon, not in a second."""
        self._kicked.set()

    async def run_forever(
        self,
        scheduler: Scheduler,
        readiness: Readiness,
        *,
        interval_s: float = 1.0,
        min_gap_s: float = 0.2,
        report: Callable[[FencePlan], object] = lambda _: None,
    ) -> None:
        """A pass every ``interval_s``, or on a :meth:`kick`, at most one per ``min_gap_s``.
        Binds then check their GPUs against ``scheduler`` once fenced (:meth:`before_bind`)."""
        self._clash = lambda plan: scheduler.dra_clash(plan.uid, plan.node, plan.gpu_ids)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._kicked.wait()
            self._kicked.clear()
            if readiness.ready:  # synced, and the leader when there are replicas
                try:
                    report(await self.pass_once(scheduler))
                except Exception:  # the next pass tries again
                    log.exception("fence pass failed")
            await asyncio.sleep(min_gap_s)

    async def pass_once(self, scheduler: Scheduler) -> FencePlan:
        """One pass: the rules wanted now, written where the published ones differ."""
        plan = scheduler.fence_plan()
        planned_at = scheduler.inventory.version  # read before any write awaits
        wanted = {rule.name for rule in plan.rules}
        writes = 0
        updates = set(plan.diff.update)
        for rule in (*plan.diff.create, *plan.diff.update):
            if writes >= self._max_writes:
                return plan
            writes += 1
            async with self._lock:
                try:
                    if rule in updates:
                        await self._rewrite(rule, timeout=self._call_timeout_s)
                    else:
                        await self._publish(rule, timeout=self._call_timeout_s)
                except ApiError as error:
                    log.warning("cannot publish fence rule %s: %s", rule.name, error)
        for name in plan.diff.delete:
            if writes >= self._max_writes:
                return plan
            async with self._lock:
                if scheduler.inventory.version != planned_at:  # a bind may have reserved it
                    planned_at = scheduler.inventory.version
                    wanted = {rule.name for rule in scheduler.fence_plan().rules}
                if name in wanted:
                    continue
                writes += 1
                await self._delete(name)
        return plan

    # -------------------------------------------------------------------------- writes

    async def _publish(self, rule: FenceRule, *, timeout: float) -> None:
        """Create the rule; one of that name already there is made this one (merge patch)."""
        try:
            await self._api.post(DEVICE_TAINT_RULES, rule_body(rule), timeout=timeout)
            log.info(
                "fenced", extra={"rule": rule.name, "node": rule.node, "device": str(rule.ref)}
            )
            return
        except ApiConflictError:
            pass
        await self._rewrite(rule, timeout=timeout)

    async def _rewrite(self, rule: FenceRule, *, timeout: float) -> None:
        """Make the rule of that name this one (merge patch); create it if it is gone."""
        patch = {"metadata": {"labels": {MANAGED_BY: "schedext"}}, "spec": rule_spec(rule)}
        try:
            await self._api.merge_patch(f"{DEVICE_TAINT_RULES}/{rule.name}", patch, timeout=timeout)
        except ApiNotFoundError:
            await self._api.post(DEVICE_TAINT_RULES, rule_body(rule), timeout=timeout)

    async def _delete(self, name: str) -> None:
        try:
            await self._api.delete(f"{DEVICE_TAINT_RULES}/{name}", timeout=self._call_timeout_s)
            log.info("fence lifted", extra={"rule": name})
        except ApiNotFoundError:
            pass
        except ApiError as error:
            log.warning("cannot delete fence rule %s: %s", name, error)


async def fence_problem(api: KubeApi, *, timeout: float = 10.0) -> str:
    """Why the fence cannot work against ``api``'s cluster, in one line; "" when it can: the
    API server serves ``devicetaintrules`` in resource.k8s.io/v1beta2, and this identity may
    create and delete them (asked with SelfSubjectAccessReviews, which anyone may make)."""
    try:
        served = await api.get(f"/apis/{API_VERSION}", timeout=timeout)
    except ApiNotFoundError:
        served = {}
    except ApiError as error:
        return f"dra.fence is on, but the API server could not be asked what it serves: {error}"
    names = {r.get("name") for r in served.get("resources") or [] if isinstance(r, dict)}
    if "devicetaintrules" not in names:
        return (
            "dra.fence is on, but the API server does not serve devicetaintrules in "
            f"{API_VERSION}. {GATE_HINT}; or turn dra.fence off"
        )
    for verb in ("create", "delete", "patch"):
        allowed = await _allowed(api, verb, timeout=timeout)
        if allowed is False:
            return (
                f"dra.fence is on, but schedext may not {verb} devicetaintrules "
                f"(resource.k8s.io): {RBAC_HINT}; or turn dra.fence off"
            )
    return ""


async def _allowed(api: KubeApi, verb: str, *, timeout: float) -> bool | None:
    """Whether this identity may ``verb`` devicetaintrules; None when it cannot be asked."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "group": "resource.k8s.io",
                "resource": "devicetaintrules",
                "verb": verb,
            }
        },
    }
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    try:
        answer = await api.post(path, review, timeout=timeout)
    except ApiError as error:
        log.warning("cannot ask whether schedext may %s devicetaintrules: %s", verb, error)
        return None
    return (answer.get("status") or {}).get("allowed") is True
