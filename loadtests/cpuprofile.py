"""``python -m cProfile``, timed by the process's CPU clock instead of the wall clock.

On a machine whose CPUs are shared (2 cores, kube-apiserver, etcd and kube-scheduler beside
schedext), a wall-clock profile charges a function with the time its thread waited for a CPU:
a socket write that wakes the peer is often preempted there, and showed as a third of
schedext's time. The CPU clock counts only what the process spent.

    python -m loadtests.cpuprofile -o OUT.prof -m app.cli serve ...
    python loadtests/cpuprofile.py -o OUT.prof -m app.cli serve ...   # from another tree

Run as a file, it puts the working directory first on the path, as ``-m`` does, so that the
module profiled is the tree's it runs in (a baseline checkout may predate this file).
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
import time


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 4 or args[0] != "-o" or args[2] != "-m":
        raise SystemExit("usage: python -m loadtests.cpuprofile -o OUT -m MODULE [ARGS...]")
    output, module = args[1], args[3]
    if not __package__:  # run as a file: its own directory is first on the path, not the tree
        sys.path[0] = os.getcwd()
    sys.argv = [module, *args[4:]]
    profiler = cProfile.Profile(time.process_time)
    try:
        profiler.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        profiler.dump_stats(output)


if __name__ == "__main__":
    main()
