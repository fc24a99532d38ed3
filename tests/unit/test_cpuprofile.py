"""loadtests/cpuprofile.py profiles the module of the tree it runs in, on the CPU clock: time
spent waiting (here, asleep) is not charged to the code that waited."""

from __future__ import annotations

import pstats
import subprocess
import sys
from pathlib import Path

from loadtests import kubeload


def test_a_module_is_profiled_on_the_cpu_clock_from_the_tree_it_runs_in(tmp_path: Path) -> None:
    (tmp_path / "napping.py").write_text(
        "import time\n\ndef nap():\n    time.sleep(0.4)\n\nnap()\n", encoding="utf-8"
    )
    out = tmp_path / "napping.prof"
    command = [sys.executable, str(kubeload.CPU_PROFILER), "-o", str(out), "-m", "napping"]
    subprocess.run(command, cwd=tmp_path, check=True, timeout=60)
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    naps = [value for (path, _, name), value in stats.items() if name == "nap"]
    assert len(naps) == 1
    assert naps[0][3] < 0.2  # its cumulative time: the CPU clock, not the 0.4 s asleep
    assert any(path == str(tmp_path / "napping.py") for path, _, _ in stats)
