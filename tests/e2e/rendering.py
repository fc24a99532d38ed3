"""helm and kustomize, built from pinned Go modules by tests/e2e/tools/build.sh (scripts/test
builds them before pytest and passes their directory in ``$SCHEDEXT_TOOLS_BIN``), and the API
objects they render: shared by the chart and kustomization tests."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testbed.kubeapply import SYSTEM_NAMESPACE

BUILD_SCRIPT = Path(__file__).resolve().parent / "tools" / "build.sh"
BIN_ENV = "SCHEDEXT_TOOLS_BIN"
TOOLS = ("helm", "kustomize")
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "schedext"
RELEASE = "schedext"

# An object's identity among rendered objects.
Key = tuple[str, str, str, str]


@functools.cache
def tools_bin() -> Path:
    """The directory holding helm and kustomize: ``$SCHEDEXT_TOOLS_BIN``, or what build.sh
    prints (a quick no-op once its cache is complete; a cold build takes about 2 minutes)."""
    override = os.environ.get(BIN_ENV)
    if override:
        directory = Path(override)
    else:
        built = subprocess.run(  # stderr inherited: build progress stays visible
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if built.returncode != 0:
            raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {built.returncode}")
        directory = Path(built.stdout.strip().splitlines()[-1])
    missing = [tool for tool in TOOLS if not os.access(directory / tool, os.X_OK)]
    if missing:
        raise FileNotFoundError(f"{directory} lacks executables: {', '.join(missing)}")
    return directory


def run_tool(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """One run of helm or kustomize, its output captured; the caller checks the exit code.
    HOME-like state (helm's cache, config and data directories) stays out of the user's."""
    state = Path(os.environ.get("TMPDIR", "/tmp")) / "schedext-e2e-helm"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(state / "cache"),
        "HELM_CONFIG_HOME": str(state / "config"),
        "HELM_DATA_HOME": str(state / "data"),
    }
    return subprocess.run(
        [str(tools_bin() / tool), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def parse(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    result = run_tool("kustomize", "build", str(directory))
    assert result.returncode == 0, f"kustomize build {directory}: {result.stderr}"
    return parse(result.stdout)


def helm_template(
    *args: str,
    namespace: str = SYSTEM_NAMESPACE,
    kube_version: str | None = None,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """`helm template` of the chart as ``release`` in ``namespace``; ``args`` are --set and
    friends."""
    version = () if kube_version is None else ("--kube-version", kube_version)
    return parse(_template(release, namespace, *version, *args))


@functools.cache
def _template(release: str, namespace: str, *args: str) -> str:
    """The rendered text, once per arguments (parsed afresh by each caller, who may edit it)."""
    result = run_tool("helm", "template", release, str(CHART), "--namespace", namespace, *args)
    assert result.returncode == 0, f"helm template {' '.join(args)}: {result.stderr}"
    return result.stdout


def key(obj: dict[str, Any]) -> Key:
    metadata = obj["metadata"]
    return obj["apiVersion"], obj["kind"], metadata.get("namespace", ""), metadata["name"]


def by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    keyed = {key(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "two objects with the same kind, namespace and name"
    return keyed
