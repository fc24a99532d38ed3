"""The kustomizations of manifests/, rendered by the pinned kustomize, against the real API
server:

* manifests/ (what both modes share: the namespace, the CRDs, the RBAC and the viewer role),
  manifests/sidecar and manifests/mtls (a mode's Deployments) each render exactly the objects
  of the files they compose, unchanged; together they cover every manifest but the node
  agent, the monitoring objects, the fence's RBAC and the examples;
* every object they render is accepted by kube-apiserver as `kubectl apply -k` would send it
  (server-side apply as a dry run, strict field validation, no warning);
* a kustomization of one's own, outside manifests/, takes the shared one and a mode at once and
  replaces the image, as docs/deploy.md shows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.controlplane import ControlPlane
from testbed.kubeapply import Kube, documents, kube_with_namespaces
from tests.e2e.rendering import ROOT, Key, by_key, key, kustomize_build

MANIFESTS = ROOT / "manifests"
CRDS = [f"crds/{path.name}" for path in sorted((MANIFESTS / "crds").glob("*.yaml"))]
# Each kustomization and the files it composes.
KUSTOMIZATIONS = {
    "manifests": ["namespace.yaml", *CRDS, "rbac.yaml", "viewer-rbac.yaml"],
    "manifests/sidecar": ["sidecar/deploy-sidecar.yaml"],
    "manifests/mtls": ["mtls/deploy-mtls.yaml"],
}
# Applied on their own: the node agent (docs/agent.md), kube-scheduler's file (not
# an API object), the Prometheus Operator's objects (they need its CRDs; docs/monitoring.md),
# the fence's RBAC (only with dra.fence; docs/dra.md). The examples are workloads.
APART = [
    "agent.yaml",
    "rbac-dra-fence.yaml",
    "scheduler-config.yaml",
    "monitoring/podmonitors.yaml",
    "monitoring/prometheusrule.yaml",
]
IMAGE = "ghcr.io/schedext/schedext"


def objects_of(files: list[str]) -> list[dict[str, Any]]:
    return [doc for name in files for doc in documents(MANIFESTS / name)]


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    with kube_with_namespaces(control_plane, documents(MANIFESTS / "namespace.yaml")) as client:
        yield client


@pytest.mark.parametrize("directory", sorted(KUSTOMIZATIONS))
def test_each_kustomization_renders_exactly_the_objects_of_its_files(directory: str) -> None:
    rendered = by_key(kustomize_build(ROOT / directory))
    assert rendered == by_key(objects_of(KUSTOMIZATIONS[directory]))


def test_the_kustomizations_cover_every_manifest_but_those_applied_apart() -> None:
    composed = {name for files in KUSTOMIZATIONS.values() for name in files}
    every = {
        path.relative_to(MANIFESTS).as_posix()
        for path in MANIFESTS.rglob("*.yaml")
        if path.name != "kustomization.yaml" and "examples" not in path.parts
    }
    assert every - composed == set(APART)


@pytest.mark.parametrize("directory", sorted(KUSTOMIZATIONS))
def test_every_object_a_kustomization_renders_is_accepted_by_the_api_server(
    kube: Kube, directory: str
) -> None:
    for obj in kustomize_build(ROOT / directory):
        result, warnings = kube.apply(obj, dry_run=True)
        assert key(result) == key(obj)
        assert not warnings, f"the API server warns about {key(obj)}: {warnings}"


@pytest.mark.parametrize("mode", ["sidecar", "mtls"])
def test_a_kustomization_of_ones_own_takes_both_and_sets_the_image(
    tmp_path: Path, mode: str
) -> None:
    # Outside manifests/: kustomize refuses a base in a parent directory of the kustomization.
    relative = Path(os.path.relpath(MANIFESTS, tmp_path))
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(relative), str(relative / mode)],
        "images": [{"name": IMAGE, "newName": "registry.example.com/schedext", "newTag": "9.9"}],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    rendered = by_key(kustomize_build(tmp_path))
    expected = by_key(objects_of(KUSTOMIZATIONS["manifests"] + KUSTOMIZATIONS[f"manifests/{mode}"]))
    assert rendered.keys() == expected.keys()
    # Nothing changed but the schedext image; kube-scheduler's stays.
    for container in containers_of(expected):
        if container["image"].startswith(f"{IMAGE}:"):
            container["image"] = "registry.example.com/schedext:9.9"
    assert rendered == expected
    assert any(c["image"].startswith("registry.k8s.io/") for c in containers_of(rendered))


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] != "Deployment":
        return []
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
    return found


def containers_of(objects: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    return [container for obj in objects.values() for container in containers(obj)]
