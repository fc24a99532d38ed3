"""Addresses over real HTTP: 1,000 concurrent binds never give an address twice."""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from tests.api.conftest import Serve
from tests.builders import ip_pod, make_ip_pool, make_node, name_of, uid_of

NODES = [make_node(f"n{i}", labels={"topology.kubernetes.io/rack": "r"}) for i in range(10)]
POOL = make_ip_pool("big", ranges=[("10.40.0.1", "10.40.3.132")], rack="r")  # 900 addresses


def test_a_thousand_concurrent_binds_for_pool_addresses_never_give_one_twice(serve: Serve) -> None:
    pods = [ip_pod(f"p{i:04d}", pool="big") for i in range(1000)]
    server = serve(nodes=NODES, pods=pods, groups=[{"kind": "IPPool", **POOL}])

    def bind(index: int) -> str:
        pod = pods[index]
        body = {
            "PodName": name_of(pod),
            "PodNamespace": "default",
            "PodUID": uid_of(pod),
            "Node": f"n{index % 10}",
        }
        with server.client() as client:
            return str(client.post("/bind", content=orjson.dumps(body)).json()["Error"])

    with ThreadPoolExecutor(max_workers=32) as pool:
        errors = list(pool.map(bind, range(len(pods))))
    assert errors.count("") == 900
    assert all(
        "no free address in IP pool big" in e or "IP pool big exhausted" in e for e in errors if e
    )
    with server.client() as client:
        metrics = client.get("/metrics").text
    assert 'schedext_ip_pool_free{pool="big"} 0.0' in metrics
    assert 'schedext_ip_pool_addresses{pool="big"} 900.0' in metrics
    held = _addresses(server.app)
    assert len(held) == 900
    assert len(set(held.values())) == 900  # distinct
    assert all(
        ipaddress.ip_address("10.40.0.1")
        <= ipaddress.ip_address(a)
        <= ipaddress.ip_address("10.40.3.132")
        for a in held.values()
    )


def _addresses(app: Any) -> dict[str, str]:
    """Pod -> address, as the bound holdings record them (read after the server settled)."""
    scheduler = app.state.service.scheduler
    return {h.key: h.ip for h in scheduler.inventory.holdings() if h.ip}
