"""Addresses over real HTTP: 1,000 concurrent binds never give an address twice.

The binder holds every bind between schedext's reserve and confirm, so that the binds really
interleave inside the handler: the first ``GATE`` of them wait until all ``GATE`` are in flight
at once, and each then yields to the event loop for a random moment before it completes or
fails (one pod in ten fails, as a refused API write would, and gives its address back).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from app.kube.binding import BindError
from extender.model import BindPlan
from testbed.builders import ip_pod, make_ip_pool, make_node, name_of, uid_of
from tests.api.conftest import Serve

NODES = [make_node(f"n{i}", labels={"topology.kubernetes.io/rack": "r"}) for i in range(10)]
FIRST, LAST = "10.40.0.1", "10.40.3.132"
POOL = make_ip_pool("big", ranges=[(FIRST, LAST)], rack="r")  # 900 addresses
PODS = 1000
GATE = 64  # binds provably in flight together
CLIENTS = 100  # concurrent HTTP connections (more than GATE)
FAILED = "injected bind failure"


class InterleavingBinder:
    confirmed_by_watch = False

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.written: dict[str, str] = {}  # pod UID -> address, binds that went through
        self.clashes: list[str] = []  # an address handed to two binds in flight at once
        self.most_in_flight = 0
        self._in_flight: dict[str, str] = {}  # address -> pod UID
        self._all_in = asyncio.Event()
        self._random = random.Random(7)

    async def bind(self, plan: BindPlan) -> None:
        assert plan.ip is not None
        if plan.ip in self._in_flight or plan.ip in self.written.values():
            self.clashes.append(plan.ip)
        self._in_flight[plan.ip] = plan.uid
        self.most_in_flight = max(self.most_in_flight, len(self._in_flight))
        try:
            if len(self._in_flight) >= GATE:
                self._all_in.set()
            await asyncio.wait_for(self._all_in.wait(), timeout=20)
            await asyncio.sleep(self._random.random() / 500)  # 0-2 ms, completions reorder
            if plan.uid in self.failing:
                raise BindError(FAILED)
            self.written[plan.uid] = plan.ip
        finally:
            self._in_flight.pop(plan.ip, None)


def test_a_thousand_concurrent_binds_for_pool_addresses_never_give_one_twice(serve: Serve) -> None:
    pods = [ip_pod(f"p{i:04d}", pool="big") for i in range(PODS)]
    binder = InterleavingBinder(failing={uid_of(p) for p in pods[::10]})
    server = serve(nodes=NODES, pods=pods, groups=[{"kind": "IPPool", **POOL}], binder=binder)

    def bind(client: httpx.Client, index: int) -> str:
        pod = pods[index]
        body = {
            "PodName": name_of(pod),
            "PodNamespace": "default",
            "PodUID": uid_of(pod),
            "Node": f"n{index % 10}",
        }
        return str(client.post("/bind", content=orjson.dumps(body)).json()["Error"])

    # CLIENTS threads, each with its own keep-alive connection, take the pods in turn.
    errors = [""] * PODS
    indices = iter(range(PODS))
    take = threading.Lock()

    def client_loop() -> None:
        with server.client() as client:
            while True:
                with take:
                    index = next(indices, None)
                if index is None:
                    return
                errors[index] = bind(client, index)

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        for done in [pool.submit(client_loop) for _ in range(CLIENTS)]:
            done.result(timeout=60)

    assert binder.most_in_flight >= GATE  # the binds interleaved between reserve and confirm
    assert binder.clashes == []
    # Each bind went through, failed as injected, or was refused because every address was
    # reserved or held at that moment; the written addresses are distinct and of the pool.
    for i, pod in enumerate(pods):
        refused = f"pod default/{name_of(pod)} no longer fits node n{i % 10}: "
        refused += "schedext: IP pool big exhausted"
        outcome = FAILED if uid_of(pod) in binder.failing else ""
        assert errors[i] in (outcome, refused), i
    written = binder.written
    assert set(written) == {uid_of(p) for p, e in zip(pods, errors, strict=True) if e == ""}
    assert len(set(written.values())) == len(written) > PODS // 2
    assert set(map(_value, written.values())) <= set(POOL_ADDRESSES)
    # What schedext holds is exactly what was written, and the pool counts it.
    assert _addresses(server.app) == written
    free = len(POOL_ADDRESSES) - len(written)
    with server.client() as client:
        metrics = client.get("/metrics").text
    assert f'schedext_ip_pool_free{{pool="big"}} {free:.1f}' in metrics
    assert 'schedext_ip_pool_addresses{pool="big"} 900.0' in metrics


def _value(address: str) -> int:
    return int(ipaddress.ip_address(address))


POOL_ADDRESSES = range(_value(FIRST), _value(LAST) + 1)


def _addresses(app: Any) -> dict[str, str]:
    """Pod UID -> address, as the bound holdings record them (read after the server settled)."""
    scheduler = app.state.service.scheduler
    return {h.uid: h.ip for h in scheduler.inventory.holdings() if h.ip}
