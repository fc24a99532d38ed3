"""Locust load for schedext: filter, prioritize and bind in a realistic mix, concurrently.

Start a server on a generated cluster, then locust against it (loopback only):

    python -m loadtests.payloads --nodes 1000 --out /tmp/cluster.json
    schedext serve --snapshot /tmp/cluster.json --port 8888 --log-level warning &
    locust -f loadtests/locustfile.py --headless -u 20 -r 10 -t 60s \\
        --host http://127.0.0.1:8888 --csv results/n1000

Each simulated kube-scheduler cycle sends filter with all node names (shuffled, as the
scheduler's parallel filters leave them), prioritize with filter's answer, and for one cycle
in ``BIND_EVERY`` a bind to the best node. Every pod is new (fresh UID), so binds allocate real
GPUs until the cluster is full; then filter answers "fewer than N free GPUs" (still a valid
load: the answer path is the same). Bind refusals "no longer fits" are expected under
concurrency: two cycles chose the same node and bind's re-check refused the second. Locust
writes _stats.csv, _stats_history.csv and
_failures.csv; its own client costs 0.7-2.4 ms per request, so use ``loadtests.bench`` for
sub-millisecond figures and this for concurrency, bind storms and soak runs.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import orjson
from locust import FastHttpUser, between, events, task

from loadtests import payloads

BIND_EVERY = int(os.environ.get("SCHEDEXT_LOCUST_BIND_EVERY", "5"))
_counter = itertools.count()
_names: list[str] = []


@events.test_start.add_listener  # type: ignore[untyped-decorator]
def _load_node_names(environment: Any, **_: Any) -> None:
    """The node names the server knows, read once from its /inventory."""
    import httpx  # noqa: PLC0415 (only when a test starts)

    host = environment.host or "http://127.0.0.1:8888"
    nodes = httpx.get(f"{host}/inventory", timeout=30).json()["nodes"]
    _names[:] = [n["name"] for n in nodes]


class KubeScheduler(FastHttpUser):
    """One kube-scheduler's extender traffic: cycles of filter, prioritize and sometimes bind."""

    wait_time = between(0, 0.002)

    @task
    def scheduling_cycle(self) -> None:
        number = next(_counter)
        pod = payloads.make_pod(
            f"load-{number}", gpus=random.choice((1, 2)), model=None, uid=f"load-{number}"
        )
        names = random.sample(_names, len(_names))
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        with self.client.post(
            "/filter", data=body.decode(), name="filter", catch_response=True
        ) as response:
            answer = response.json() if response.status_code == 200 else {}
            if answer.get("Error"):
                response.failure(answer["Error"])
                return
        passed = answer.get("NodeNames") or []
        if len(passed) > 1:
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})
            with self.client.post(
                "/prioritize", data=body.decode(), name="prioritize", catch_response=True
            ) as response:
                scores = response.json() if response.status_code == 200 else []
                if not isinstance(scores, list):
                    response.failure("prioritize answer is not a list")
                    return
            best = max(scores, key=lambda s: s["Score"])["Host"] if scores else passed[0]
        elif passed:
            best = passed[0]
        else:
            return
        if number % BIND_EVERY == 0:
            binding = {
                "PodName": pod["metadata"]["name"],
                "PodNamespace": "ml",
                "PodUID": pod["metadata"]["uid"],
                "Node": best,
            }
            with self.client.post(
                "/bind", data=orjson.dumps(binding).decode(), name="bind", catch_response=True
            ) as response:
                error = (
                    response.json().get("Error") if response.status_code == 200 else "HTTP error"
                )
                if error:
                    response.failure(error)
