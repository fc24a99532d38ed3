"""The list-format benchmark (``python -m loadtests.listformats``) runs end to end at a tiny
size against the real kube-apiserver: every pod is listed in each format, and schedext's two
decoders give the same values for every pod (the benchmark refuses to print a figure
otherwise). A smoke test: no assertion is about how
fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtests.listformats import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
PODS = 60


def test_list_formats_lists_every_pod_in_each_format_and_both_decoders_agree(
    tmp_path: Path,
) -> None:
    out = tmp_path / "formats.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.listformats", "--nodes", "5", "--pods", str(PODS),
         "--reps", "1", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "schedext's decode of one page (60 pods;" in result.stdout

    report = json.loads(out.read_text())
    assert report["fill"]["done"] == PODS
    assert list(report["server"]) == [v.name for v in VARIANTS]
    for name, row in report["server"].items():
        assert row["wire_bytes"] > 0, name
    client = report["client"]
    assert client["pods_per_page"] == PODS  # one page: the whole namespace
    assert client["protobuf_bytes"] < client["json_bytes"]
    for key in ("json_us", "protobuf_us"):
        assert client[key] > 0, key
