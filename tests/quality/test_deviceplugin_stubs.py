"""The committed kubelet API stubs (the device plugin's and PodResources') and the API server's
list messages are exactly what scripts/gen-deviceplugin makes of the committed .proto files: a
hand edit, or a proto change without regeneration, fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (Path("app/agent/deviceplugin/v1beta1"), Path("app/agent/podresources/v1"))
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
WIRE = Path("app/kube/wire")  # messages only: no gRPC stub
WIRE_STUBS = ("lists_pb2.py", "lists_pb2.pyi")


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ROOT / "scripts/gen-deviceplugin"), "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    generated = [package / name for package in PACKAGES for name in STUBS]
    for path in [*generated, *(WIRE / name for name in WIRE_STUBS)]:
        fresh = (tmp_path / path).read_text()
        committed = (ROOT / path).read_text()
        assert committed == fresh, f"{path} drifted: run scripts/gen-deviceplugin"


@pytest.mark.parametrize("package", [*PACKAGES, WIRE], ids=str)
@pytest.mark.parametrize("name", [".proto", ".pyi"])
def test_the_proto_and_message_stubs_ship_in_the_package(package: Path, name: str) -> None:
    # setuptools only copies non-Python files named in package-data; a wheel without the .pyi
    # leaves its users' type checks blind, without the .proto the stubs' source is lost.
    pyproject = (ROOT / "pyproject.toml").read_text()
    inside = package.relative_to("app")
    assert f'"{inside}/*{name}"' in pyproject
