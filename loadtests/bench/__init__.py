"""Tight single-connection latency benchmark of filter and prioritize.

For each cluster size it starts ``schedext serve`` on a generated snapshot (loopback only),
then sends interleaved rounds over ONE keep-alive connection: the constant-answer endpoint
(same server, same body, no decision: the floor), filter (names mode, node order shuffled as
kube-scheduler's parallel filters do), and prioritize (with exactly the list filter returned,
as kube-scheduler sends it). It prints p50/p90/p99 per verb and N, and the ratios to the floor.
It also times the core alone, in a process of its own, on the same data (loadtests/corebench.py).

``--scenarios whole,shares`` measures two workloads in the same run, a server each, their
rounds interleaved: *whole*, the cluster of ``payloads.make_cluster`` and a pod asking for
whole GPUs (``--pod``); *shares*, 8-GPU nodes with half their GPUs holding shares
(``payloads.make_share_cluster``) and a pod asking for a share (10 GiB and 25 % of the cores
of one GPU). ``quotas`` is the whole scenario with team quotas: the same cluster and pod plus
50 ElasticQuotas (``payloads.make_quota_cluster``), the pod's namespace under one of them and
borrowing over its min. Each has its floor (its own server's constant answer), and it then
also prints, per size, each scenario over whole. Whenever more than one server runs (two
scenarios, or a baseline), all of them share one CPU, and so do the cores.

The DRA scenarios (issue 31; ``loadtests/dra_payloads.py``): *dra*, whole's cluster with half
its nodes DRA's (8 GPUs each in a ``gpu.nvidia.com`` ResourceSlice, no ``nvidia.com/gpu``,
about 40 % of them held by allocated claims of bound pods; the DeviceClass serving
``nvidia.com/gpu``) and the whole pod; *claim* and *dra-claim*, whole's and dra's clusters
with a pod asking for the same GPUs through a ResourceClaim, made and not yet allocated. A
snapshot holds no DRA objects: in a run with one of them every server lists and watches a
stand-in API server of its scenario (``resource.k8s.io/v1`` served), the rounds starting once
the servers are done recording Events. It then also prints half DRA over no DRA per pod (dra
over whole, dra-claim over claim).

With ``--baseline DIR`` (another checkout of schedext, e.g. ``git worktree add --detach
../schedext-before <commit>``, its compiled part built with ``setup.py build_ext --inplace``)
both trees' servers run on the same snapshot, each on its own connection, and every round
sends the same bodies to both, the tree that goes first swapped every round; the core is
timed for both, in alternating batches. Both servers share one CPU, and so do both cores:
on a shared machine two CPUs can differ in speed for minutes. It then also prints, per size,
this tree's p50 over the baseline's.

With ``--load`` the servers run as in a throughput run instead, against a stand-in API server
each (``loadtests/standin.py``: list+watch of the same cluster, Bindings answered), and
every round's pod is a new one (``load-pod-N``, the ``--pod`` shape): filter, prioritize
with filter's answer, then the constant answer. Rounds come in blocks, idle and loaded
alternating. A loaded round first binds the pod filtered in the round before, on a connection
of its own, and does not wait for the answer: kube-scheduler binds pod N while it schedules
pod N+1, its filter call coming after its own filter plugins (``--bind-lead-ms`` later). The
stand-in answers the Binding after ``--binding-delay-ms`` (kube-apiserver's write), then sends
two pod watch events (the pod bound, another created). That bind, its Binding POST and answer
and those events share schedext's event loop with the rounds' requests. It prints each verb's
round trip idle and loaded, and where schedext's own ``schedext_request_stage_seconds``
(scraped around every block) says the time went.

    python -m loadtests.bench --nodes 100,1000,5000 --rounds 2000
    python -m loadtests.bench --nodes 5000 --rounds 1000 --baseline ../schedext-before
    python -m loadtests.bench --nodes 5000 --rounds 2000 --scenarios whole,shares
    python -m loadtests.bench --nodes 5000 --rounds 1000 --scenarios whole,quotas
    python -m loadtests.bench --nodes 5000 --rounds 2000 --scenarios whole,claim,dra,dra-claim
    python -m loadtests.bench --nodes 1000 --rounds 1000 --pod any --load

The package: ``cli`` (the flags, and the order of things), ``workload`` (the scenarios and
what is sent), ``runs`` (the plain rounds and the core's batches, and the rows of figures),
``loaded`` (``--load``), ``servers`` (the processes measured, and their CPUs), ``wire`` (one
timed request) and ``report`` (the tables).
"""
