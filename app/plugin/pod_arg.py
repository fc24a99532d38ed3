"""The pod a command is asked about: ``NAMESPACE/NAME``, or ``NAME`` with ``-n NAMESPACE``,
each a Kubernetes name (a namespace a DNS label, a pod name a DNS subdomain), so that
``a/b/c`` is refused here rather than sent as a path the server does not serve."""

from __future__ import annotations

import re

__all__ = ["NAMESPACE", "POD", "pod_of"]

NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
POD = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")


def pod_of(argument: str, namespace: str | None) -> tuple[str, str]:
    """(namespace, name) of ``argument``; raises ValueError saying what to give instead."""
    given, _, name = argument.rpartition("/")
    if given and namespace and given != namespace:
        raise ValueError(f"the pod {argument} is not in -n {namespace}")
    given = given or namespace or ""
    if not given:
        raise ValueError(f"give the pod as NAMESPACE/NAME, or NAME with -n NAMESPACE: {argument}")
    if not NAMESPACE.fullmatch(given):
        raise ValueError(f"{given!r} is not a namespace name (give NAMESPACE/NAME)")
    if not POD.fullmatch(name):
        raise ValueError(f"{name!r} is not a pod name (give NAMESPACE/NAME)")
    return given, name
