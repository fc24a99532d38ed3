"""``python -m loadtests.soak``: a seeded fault soak against the real control plane, with an
invariant checker that reads the API server's own state.

Two schedext replicas under leader election serve a real kube-scheduler (as the shipped mTLS
mode does), while a seeded stream of pods (whole GPUs, GPU shares, pool and sticky addresses,
gangs, two priorities, deletions) meets a seeded schedule of faults (leader killed or stopped,
kube-apiserver restarted, etcd compacted under cut watches, watches cut, the API slowed,
kube-scheduler restarted). The rooms:

* :mod:`~loadtests.soak.workload`: the units of work, and when each goes (pure, seeded);
* :mod:`~loadtests.soak.faults`: the fault kinds and their schedule (pure, seeded);
* :mod:`~loadtests.soak.checker`: the invariants (pure, unit-tested);
* :mod:`~loadtests.soak.reading`: the API server's state read into the checker's values;
* :mod:`~loadtests.soak.rig`: the cluster, the replicas, the proxies, and each fault done;
* :mod:`~loadtests.soak.run`: one run's phases (stream, drain, teardown) and its threads;
* :mod:`~loadtests.soak.figures`: the result, as figures;
* :mod:`~loadtests.soak.planted`: schedext with one guard out, to show the checker bites.

docs/reliability.md says what is promised, how this tests it, and the figures of a long run.
"""
