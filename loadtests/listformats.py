"""What a pod list costs in JSON and in protobuf: kube-apiserver's CPU to serve it, and
schedext's CPU to decode it.

A cold sync of 300,000 pods runs schedext and kube-apiserver on the same CPUs, and serving the
list as JSON is most of the API server's share. Kubernetes also serves lists as protobuf
(``application/vnd.kubernetes.protobuf``). This measures both sides of that choice, so that it
is made on figures:

1. against the end-to-end harness's real etcd + kube-apiserver (loopback only), it creates the
   sync benchmark's nodes and bound pods (``loadtests.sync``), then lists every pod page by
   page in each format, the formats alternating rep by rep, and charges kube-apiserver's and
   etcd's CPU time (/proc) per pod listed;
2. in this process, it decodes one page of each with schedext's own decoders: the JSON page
   with ``app/kube/shapes.py`` (msgspec), the protobuf page with ``app/kube/list_pages.py``
   (upb, then the same plain values). It checks that both give the same values for every pod
   before it prints a figure.

    python -m loadtests.listformats                      # 1,000 nodes, 20,000 pods, 5 reps
    python -m loadtests.listformats --pods 5000 --reps 3 --json formats.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from app.kube import list_pages
from app.kube.shapes import POD_DECODERS
from loadtests import kubeload
from loadtests.kubeload import RestPool
from loadtests.sync import NAMESPACE, Plan, fill

JSON = dict[str, Any]
AS_JSON = "application/json"
AS_PROTOBUF = list_pages.PROTOBUF
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
T = TypeVar("T")


@dataclass(frozen=True)
class Variant:
    name: str
    accept: str
    encoding: str  # Accept-Encoding
    page: int


VARIANTS = (
    Variant("JSON (as schedext lists)", AS_JSON, "gzip", 5000),
    Variant("protobuf", AS_PROTOBUF, "gzip", 5000),
    Variant("protobuf, no gzip", AS_PROTOBUF, "identity", 5000),
    Variant("JSON, pages of 500", AS_JSON, "gzip", 500),
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kubeload.exit_on_signals()
    plan = Plan.build(args.nodes, args.pods, gpu_fill=0.75, compact=True)
    report: JSON = {"machine": kubeload.machine_info(), "nodes": args.nodes, "pods": args.pods}
    with kubeload.control_plane() as cp, RestPool(cp, args.concurrency) as pool:
        report["fill"] = fill(pool, plan)["pods"]
        report["server"] = _server(pool, args.pods, args.reps)
        pages = {accept: _first_page(pool, accept) for accept in (AS_JSON, AS_PROTOBUF)}
    report["client"] = _client(pages[AS_JSON], pages[AS_PROTOBUF], args.reps)
    _print(report)
    if args.json:
        args.json.write_text(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests.listformats", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="N nodes (default 1000)")
    parser.add_argument("--pods", type=int, default=20_000, help="M bound pods (default 20000)")
    parser.add_argument("--reps", type=int, default=5, help="lists per format (default 5)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (fill)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    return parser


# ---------------------------------------------------------------------------------------------
# The API server's side
# ---------------------------------------------------------------------------------------------


def _server(pool: RestPool, pods: int, reps: int) -> JSON:
    meter_pids = kubeload.process_ids(("kube-apiserver", "etcd"))
    runs: dict[str, list[JSON]] = {v.name: [] for v in VARIANTS}
    for rep in range(reps):
        for variant in VARIANTS:
            meter = kubeload.CpuMeter(meter_pids).start()
            listed, wire = _list_all(pool, variant)
            spent = meter.read()
            if listed != pods:
                raise SystemExit(f"{variant.name}: listed {listed} pods, created {pods}")
            runs[variant.name].append(
                {
                    "apiserver_us": spent["kube-apiserver"] / pods * 1e6,
                    "etcd_us": spent["etcd"] / pods * 1e6,
                    "wire_bytes": wire / pods,
                }
            )
            print(f"  rep {rep + 1}: {variant.name}: {spent['kube-apiserver']:.2f} s", flush=True)
    return {name: _medians(rows) for name, rows in runs.items()}


def _list_all(pool: RestPool, variant: Variant) -> tuple[int, int]:
    """Every pod of the namespace, page by page: (pods listed, bytes on the wire)."""
    token, listed, wire = "", 0, 0
    headers = {"Accept": variant.accept, "Accept-Encoding": variant.encoding}
    while True:
        params = {"limit": str(variant.page)} | ({"continue": token} if token else {})
        with pool.client.stream("GET", PODS_PATH, params=params, headers=headers) as response:
            response.raise_for_status()
            body = response.read()
            wire += response.num_bytes_downloaded
        page = POD_DECODERS.list(body)  # JSON or protobuf, as answered
        listed += len(page["items"])
        token = page["metadata"].get("continue", "")
        if not token:
            return listed, wire


def _first_page(pool: RestPool, accept: str) -> bytes:
    response = pool.client.get(
        PODS_PATH,
        params={"limit": "5000"},
        headers={"Accept": accept, "Accept-Encoding": "identity"},
    )
    response.raise_for_status()
    return response.content


# ---------------------------------------------------------------------------------------------
# schedext's side
# ---------------------------------------------------------------------------------------------


def _client(json_page: bytes, protobuf_page: bytes, reps: int) -> JSON:
    decoded = POD_DECODERS.list(json_page)["items"]
    converted = list_pages.pod_page(protobuf_page)["items"]
    mismatches = sum(1 for a, b in zip(decoded, converted, strict=True) if a != b)
    if mismatches:
        raise SystemExit(f"protobuf and JSON disagree on {mismatches} of {len(decoded)} pods")
    pods = len(decoded)
    rows: list[JSON] = []
    gc.disable()  # as the service decodes a sync: the collector paused until it is in
    try:
        for _ in range(reps):
            json_s, _page = _cpu(functools.partial(POD_DECODERS.list, json_page))
            list_pages.forget_templates()  # each rep reads its templates afresh
            protobuf_s, _page = _cpu(functools.partial(list_pages.pod_page, protobuf_page))
            rows.append({"json_us": json_s / pods * 1e6, "protobuf_us": protobuf_s / pods * 1e6})
    finally:
        gc.enable()
    return {
        "pods_per_page": pods,
        "json_bytes": len(json_page) / pods,
        "protobuf_bytes": len(protobuf_page) / pods,
        **_medians(rows),
    }


def _cpu(work: Callable[[], T]) -> tuple[float, T]:
    """CPU seconds of one call, and what it returned (kept until measured, so that freeing it
    is not charged to the next call)."""
    began = time.process_time()
    result = work()
    return time.process_time() - began, result


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _medians(rows: list[JSON]) -> JSON:
    return {key: round(statistics.median(r[key] for r in rows), 1) for key in rows[0]}


def _print(report: JSON) -> None:
    server, client = report["server"], report["client"]
    base = server[VARIANTS[0].name]["apiserver_us"]
    print(
        f"\nA pod list, {report['pods']:,} pods on {report['nodes']:,} nodes "
        f"(medians; CPU µs per pod listed)"
    )
    print(f"{'format':28s} {'kube-apiserver':>15s} {'etcd':>6s} {'to JSON':>8s} {'B/pod':>6s}")
    for name, row in server.items():
        print(
            f"{name:28s} {row['apiserver_us']:15.1f} {row['etcd_us']:6.1f} "
            f"{row['apiserver_us'] / base if base else 0:8.2f} {row['wire_bytes']:6.0f}"
        )
    print(
        f"\nschedext's decode of one page ({client['pods_per_page']:,} pods; "
        f"{client['json_bytes']:.0f} B a pod in JSON, {client['protobuf_bytes']:.0f} in "
        "protobuf)"
    )
    print(f"  JSON (shapes.py, msgspec):            {client['json_us']:6.1f} µs a pod")
    print(f"  protobuf (list_pages.py, upb):        {client['protobuf_us']:6.1f} µs a pod")
    ratio = client["protobuf_us"] / client["json_us"]
    print(f"  protobuf in all, to JSON:             {ratio:6.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
