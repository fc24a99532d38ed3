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
2. in this process, it decodes one page of each: the JSON page with schedext's own decoder
   (``app/kube/shapes.py``, msgspec), the protobuf page with the protobuf runtime (upb) against
   a schema of the same fields (``listformats.proto``, compiled at run time), then turned into
   the same plain values the core reads. It checks that both give the same values for every
   pod before it prints a figure.

    python -m loadtests.listformats                      # 1,000 nodes, 20,000 pods, 5 reps
    python -m loadtests.listformats --pods 5000 --reps 3 --json formats.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import orjson
from grpc_tools import protoc

from app.kube.shapes import POD_DECODERS
from loadtests import kubeload
from loadtests.kubeload import RestPool
from loadtests.sync import NAMESPACE, Plan, _fill

JSON = dict[str, Any]
AS_JSON = "application/json"
AS_PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"  # a protobuf answer's first bytes, before its runtime.Unknown envelope
PROTO = Path(__file__).with_name("listformats.proto")
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
    schema = compile_schema(Path(tempfile.mkdtemp(prefix="schedext-listformats-")))
    plan = Plan.build(args.nodes, args.pods, gpu_fill=0.75, compact=True)
    report: JSON = {"machine": kubeload.machine_info(), "nodes": args.nodes, "pods": args.pods}
    with kubeload.control_plane() as cp, RestPool(cp, args.concurrency) as pool:
        report["fill"] = _fill(pool, plan)["pods"]
        report["server"] = _server(pool, schema, args.pods, args.reps)
        pages = {accept: _first_page(pool, accept) for accept in (AS_JSON, AS_PROTOBUF)}
    report["client"] = _client(pages[AS_JSON], pages[AS_PROTOBUF], schema, args.reps)
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


def compile_schema(out: Path) -> ModuleType:
    """``listformats.proto`` compiled by grpcio-tools' protoc (a development dependency) and
    imported: the benchmark's own schema, not the service's."""
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={out}", PROTO.name]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO.name}")
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("listformats_pb2")
    finally:
        sys.path.remove(str(out))


# ---------------------------------------------------------------------------------------------
# The API server's side
# ---------------------------------------------------------------------------------------------


def _server(pool: RestPool, schema: ModuleType, pods: int, reps: int) -> JSON:
    meter_pids = kubeload.process_ids(("kube-apiserver", "etcd"))
    runs: dict[str, list[JSON]] = {v.name: [] for v in VARIANTS}
    for rep in range(reps):
        for variant in VARIANTS:
            meter = kubeload.CpuMeter(meter_pids).start()
            listed, wire = _list_all(pool, schema, variant)
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


def _list_all(pool: RestPool, schema: ModuleType, variant: Variant) -> tuple[int, int]:
    """Every pod of the namespace, page by page: (pods listed, bytes on the wire)."""
    token, listed, wire = "", 0, 0
    headers = {"Accept": variant.accept, "Accept-Encoding": variant.encoding}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    while True:
        params = {"limit": str(variant.page)} | ({"continue": token} if token else {})
        with pool.client.stream("GET", path, params=params, headers=headers) as response:
            response.raise_for_status()
            body = response.read()
            wire += response.num_bytes_downloaded
        if variant.accept == AS_JSON:
            page = orjson.loads(body)
            listed += len(page["items"])
            token = page["metadata"].get("continue", "")
        else:
            pod_list = schema.PodList.FromString(unwrap(schema, body))
            listed += len(pod_list.items)
            token = getattr(pod_list.metadata, "continue")
        if not token:
            return listed, wire


def _first_page(pool: RestPool, accept: str) -> bytes:
    response = pool.client.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        params={"limit": "5000"},
        headers={"Accept": accept, "Accept-Encoding": "identity"},
    )
    response.raise_for_status()
    return response.content


def unwrap(schema: ModuleType, body: bytes) -> bytes:
    """The list's bytes inside a protobuf answer's envelope."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf answer")
    raw: bytes = schema.Unknown.FromString(body[len(MAGIC) :]).raw
    return raw


# ---------------------------------------------------------------------------------------------
# schedext's side
# ---------------------------------------------------------------------------------------------


def _client(json_page: bytes, protobuf_page: bytes, schema: ModuleType, reps: int) -> JSON:
    parse = functools.partial(_parse, schema, protobuf_page)
    decoded = POD_DECODERS.list(json_page)["items"]
    converted = [pod_values(p) for p in parse().items]
    mismatches = sum(1 for a, b in zip(decoded, converted, strict=True) if kept(a) != b)
    if mismatches:
        raise SystemExit(f"protobuf and JSON disagree on {mismatches} of {len(decoded)} pods")
    pods = len(decoded)
    rows: list[JSON] = []
    gc.disable()  # as the service decodes a sync: the collector paused until it is in
    try:
        for _ in range(reps):
            json_s, _page = _cpu(functools.partial(POD_DECODERS.list, json_page))
            parse_s, pod_list = _cpu(parse)
            values_s, _values = _cpu(lambda: [pod_values(p) for p in pod_list.items])  # noqa: B023
            rows.append(
                {
                    "json_us": json_s / pods * 1e6,
                    "protobuf_parse_us": parse_s / pods * 1e6,
                    "protobuf_values_us": values_s / pods * 1e6,
                    "protobuf_us": (parse_s + values_s) / pods * 1e6,
                }
            )
    finally:
        gc.enable()
    return {
        "pods_per_page": pods,
        "json_bytes": len(json_page) / pods,
        "protobuf_bytes": len(protobuf_page) / pods,
        **_medians(rows),
    }


def _parse(schema: ModuleType, body: bytes) -> Any:
    return schema.PodList.FromString(unwrap(schema, body))


def _cpu(work: Callable[[], T]) -> tuple[float, T]:
    """CPU seconds of one call, and what it returned (kept until measured, so that freeing it
    is not charged to the next call)."""
    began = time.process_time()
    result = work()
    return time.process_time() - began, result


def pod_values(pod: Any) -> JSON:
    """A protobuf pod as the plain values the JSON decoder gives for the same fields: a field
    the API server leaves out of JSON (empty, or unset) is left out here too."""
    spec, out = pod.spec, {"metadata": _meta(pod.metadata)}
    values: JSON = {"containers": [_container(c) for c in spec.containers]}
    if spec.initContainers:
        values["initContainers"] = [_container(c) for c in spec.initContainers]
    if spec.nodeName:
        values["nodeName"] = spec.nodeName
    if spec.HasField("priority"):
        values["priority"] = spec.priority
    if spec.preemptionPolicy:
        values["preemptionPolicy"] = spec.preemptionPolicy
    if spec.overhead:
        values["overhead"] = _quantities(spec.overhead)
    if spec.HasField("resources"):
        values["resources"] = _resources(spec.resources)
    out["spec"] = values
    out["status"] = {"phase": pod.status.phase} if pod.status.phase else {}
    return out


def _meta(meta: Any) -> JSON:
    values: JSON = {}
    for name in ("name", "namespace", "uid", "resourceVersion"):
        if text := getattr(meta, name):
            values[name] = text
    if meta.labels:
        values["labels"] = dict(meta.labels)
    if meta.annotations:
        values["annotations"] = dict(meta.annotations)
    if meta.ownerReferences:
        values["ownerReferences"] = [_owner(o) for o in meta.ownerReferences]
    return values


def _owner(owner: Any) -> JSON:
    values = {"apiVersion": owner.apiVersion, "kind": owner.kind, "name": owner.name}
    values["uid"] = owner.uid
    if owner.HasField("controller"):
        values["controller"] = owner.controller
    return values


def _container(container: Any) -> JSON:
    values: JSON = {"name": container.name}
    if container.HasField("resources"):
        values["resources"] = _resources(container.resources)
    if container.restartPolicy:
        values["restartPolicy"] = container.restartPolicy
    return values


def _resources(resources: Any) -> JSON:
    values: JSON = {}
    if resources.limits:
        values["limits"] = _quantities(resources.limits)
    if resources.requests:
        values["requests"] = _quantities(resources.requests)
    return values


def _quantities(entries: Any) -> JSON:
    return {name: quantity.string for name, quantity in entries.items()}


def kept(pod: JSON) -> JSON:
    """A JSON-decoded pod cut to the fields ``listformats.proto`` names."""
    meta = pod.get("metadata", {})
    out_meta = {k: v for k, v in meta.items() if k != "ownerReferences"}
    if "ownerReferences" in meta:
        owner_keys = ("apiVersion", "kind", "name", "uid", "controller")
        out_meta["ownerReferences"] = [
            {k: o[k] for k in owner_keys if k in o} for o in meta["ownerReferences"]
        ]
    spec = pod.get("spec", {})
    spec_keys = (
        "containers",
        "initContainers",
        "nodeName",
        "priority",
        "preemptionPolicy",
        "overhead",
        "resources",
    )
    out_spec = {k: spec[k] for k in spec_keys if k in spec}
    for key in ("containers", "initContainers"):
        if key in out_spec:
            out_spec[key] = [_kept_container(c) for c in out_spec[key]]
    if "resources" in out_spec:
        out_spec["resources"] = _kept_resources(out_spec["resources"])
    status = pod.get("status", {})
    return {
        "metadata": out_meta,
        "spec": out_spec,
        "status": {"phase": status["phase"]} if "phase" in status else {},
    }


def _kept_container(container: JSON) -> JSON:
    out: JSON = {k: container[k] for k in ("name", "resources", "restartPolicy") if k in container}
    if "resources" in out:
        out["resources"] = _kept_resources(out["resources"])
    return out


def _kept_resources(resources: JSON) -> JSON:
    return {k: resources[k] for k in ("limits", "requests") if resources.get(k)}


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
    print(f"  JSON, schedext's decoder (msgspec):   {client['json_us']:6.1f} µs a pod")
    print(f"  protobuf (upb), parse:                {client['protobuf_parse_us']:6.1f} µs a pod")
    print(f"  protobuf, to the same values:         {client['protobuf_values_us']:6.1f} µs a pod")
    ratio = client["protobuf_us"] / client["json_us"]
    print(f"  protobuf in all, to JSON:             {ratio:6.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
