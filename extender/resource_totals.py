"""A pod's effective request per resource, as kube-scheduler's ``PodRequests`` sums it: the
sum over containers and restartable (sidecar) init containers, the element-wise max with each
regular init container plus the sidecars declared before it, pod-level ``spec.resources`` for
cpu/memory when set, plus ``spec.overhead``. A resource given only in ``limits`` is requested
at its limit, as the API server's defaulting does.

Amounts are whole nano-units (:func:`extender.quantity.to_nano`), each within what the
inventory's int64 columns hold: a quantity that is not one, or a total out of that range,
raises :class:`~extender.errors.PodRequestError` naming the resource and where it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from extender import fields
from extender.errors import PodRequestError
from extender.fields import JSONObject
from extender.quantity import MAX_MAGNITUDE, NANO, QuantityError, QuantityRangeError, to_nano

__all__ = ["CPU", "MEMORY", "effective_requests"]

CPU = "cpu"
MEMORY = "memory"
_MAX_NANO = MAX_MAGNITUDE * NANO  # the most of any resource, in nano-units
_MAX_MILLI_NANO = MAX_MAGNITUDE * (NANO // 1000)  # the most CPU, 2^63-1 milli-units


def effective_requests(spec: JSONObject, resources: tuple[str, ...]) -> dict[str, int]:
    """Per resource, the pod's effective request in nano-units (see :func:`to_nano`). A
    field of the wrong JSON type (``containers`` not a list of objects, ``limits`` a string)
    raises :class:`PodRequestError` naming it, as a quantity that is not one does."""
    try:
        return _effective_requests(spec, resources)
    except fields.ShapeError as error:
        raise PodRequestError(str(error)) from None


def _effective_requests(spec: JSONObject, resources: tuple[str, ...]) -> dict[str, int]:
    containers = fields.strict_objects(spec, "containers", "spec")
    init_containers = fields.strict_objects(spec, "initContainers", "spec")
    total = dict.fromkeys(resources, 0)
    for container in containers:
        _add(total, _container_requests(container, resources))
    sidecars_so_far = dict.fromkeys(resources, 0)
    for container in init_containers:
        requests = _container_requests(container, resources)
        if _restart_policy(container) == "Always":
            # A sidecar runs beside the main containers for the pod's whole life.
            _add(total, requests)
            _add(sidecars_so_far, requests)
            continue
        for resource in resources:
            total[resource] = max(total[resource], requests[resource] + sidecars_so_far[resource])
    pod_level = fields.strict_obj(
        fields.strict_obj(spec, "resources", "spec"), "requests", "spec.resources"
    )
    for resource in (CPU, MEMORY):
        if resource in resources and resource in pod_level:
            total[resource] = _quantity(pod_level[resource], resource, "spec.resources")
    overhead = fields.strict_obj(spec, "overhead", "spec")
    for resource in resources:
        if resource in overhead:
            total[resource] += _quantity(overhead[resource], resource, "spec.overhead")
    for resource, value in total.items():
        # The sum of quantities, each within Kubernetes's range, may not be; nor may CPU once
        # counted in milli-units. Either would overflow the inventory's int64 columns.
        if value > (_MAX_MILLI_NANO if resource == CPU else _MAX_NANO):
            raise PodRequestError(f"{resource} out of range: the pod asks for more than 2^63-1")
    return total


def _container_requests(container: JSONObject, resources: tuple[str, ...]) -> dict[str, int]:
    try:
        block = fields.strict_obj(container, "resources", "")
        requests = fields.strict_obj(block, "requests", "resources")
        limits = fields.strict_obj(block, "limits", "resources")
    except fields.ShapeError as error:
        raise fields.ShapeError(f"{_container(container)}: {error}") from None
    # Walk the few resources the container names rather than look up every one counted (six
    # with GPU shares): a relist of 300,000 pods does this for each of their containers.
    out = dict.fromkeys(resources, 0)
    for resource, raw in limits.items():
        if resource in out and raw is not None and resource not in requests:
            out[resource] = _quantity(raw, resource, container)  # requested at its limit
    for resource, raw in requests.items():
        if resource in out and raw is not None:
            out[resource] = _quantity(raw, resource, container)
    return out


def _restart_policy(container: JSONObject) -> str:
    try:
        return fields.strict_text(container, "restartPolicy", "")
    except fields.ShapeError as error:
        raise fields.ShapeError(f"{_container(container)}: {error}") from None


def _container(container: JSONObject) -> str:
    """The container, for a message."""
    return f"container {fields.text(container, 'name') or '?'!r}"


def _quantity(raw: object, resource: str, where: str | JSONObject) -> int:
    """``raw`` in nano-units. ``where`` names the place for errors (a container is named only
    when an error needs it: formatting a name per quantity is measurable at 100k pods)."""
    value = None
    problem = "is not a quantity"
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        try:
            value = to_nano(raw)
        except QuantityRangeError:
            problem = "is out of range (over 2^63-1)"
        except QuantityError:
            pass
    if value is None or value < 0:
        if not isinstance(where, str):
            where = _container(where)
        problem = problem if value is None else "must not be negative"
        raise PodRequestError(f"{where}: {resource} {problem}: {fields.quoted(raw)}")
    return value


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for resource, value in more.items():
        total[resource] += value
