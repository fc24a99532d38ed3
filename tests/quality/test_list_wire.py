"""app/kube/wire/lists.proto names a subset of the API server's own messages: every field it
declares has the name and number of the upstream generated.proto at the Kubernetes version the
control plane is built from (a wrong number would decode another field's bytes, or none). The
upstream files come from the Go module cache, where tests/e2e/controlplane/build.sh puts them;
without it this is skipped, and the e2e tier's test_list_pages still compares every decoded
value with the JSON of a real API server."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.kube.wire import lists_pb2

ROOT = Path(__file__).resolve().parents[2]
GO_MOD = ROOT / "tests/e2e/controlplane/go.mod"
UPSTREAM = {  # module -> generated.proto files that define the messages lists.proto names
    "k8s.io/api": ["core/v1/generated.proto"],
    "k8s.io/apimachinery": [
        "pkg/apis/meta/v1/generated.proto",
        "pkg/runtime/generated.proto",
        "pkg/api/resource/generated.proto",
    ],
}
OURS_ONLY = {"Term"}  # a term whose presence is all that is read: no upstream message
FIELD = re.compile(r"^\s*(?:optional|repeated)?\s*(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;")


def _version(module: str) -> str:
    for line in GO_MOD.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module and parts[1].startswith("v"):
            return parts[1]
        if len(parts) >= 4 and parts[0] == module and parts[1] == "=>":
            return parts[3]
    raise AssertionError(f"{module} is not pinned in {GO_MOD}")


def _upstream_messages() -> dict[str, dict[str, int]]:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        pytest.skip("no Go toolchain: the upstream protos are not here")
    cache = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    messages: dict[str, dict[str, int]] = {}
    for module, files in UPSTREAM.items():
        for name in files:
            path = Path(cache) / f"{module}@{_version(module)}" / name
            if not path.exists():
                pytest.skip(f"{path} is not in the module cache (run the control plane's build)")
            current: dict[str, int] | None = None
            for line in path.read_text().splitlines():
                if match := re.match(r"^message (\w+) \{", line):
                    current = messages.setdefault(match.group(1), {})
                elif line.startswith("}"):
                    current = None
                elif current is not None and (field := FIELD.match(line)):
                    current[field.group(1)] = int(field.group(2))
    return messages


def test_every_field_has_the_upstream_name_and_number() -> None:
    upstream = _upstream_messages()
    checked = 0
    for message in lists_pb2.DESCRIPTOR.message_types_by_name.values():
        if message.name in OURS_ONLY:
            continue
        assert message.name in upstream, f"{message.name}: no such upstream message"
        for field in message.fields:
            expected = upstream[message.name].get(field.name)
            assert expected == field.number, f"{message.name}.{field.name}: upstream {expected}"
            checked += 1
    assert checked > 60  # every message was found and read
