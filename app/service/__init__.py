"""The extender service (``schedext serve``): the verbs kube-scheduler calls, the read-only
views and the occupancy page, over the pure core in ``extender/``.

Routes decode a request, call one method of :class:`extender.scheduler.Scheduler`, and encode
the answer; everything that decides lives in the core. :mod:`~app.service.main` assembles a
running service (:class:`~app.service.assembly.Service`) from its settings, an inventory source
(a snapshot, the embedded demo, or the live cluster through :mod:`app.kube`) and a binder. It
never loads the node agent (gRPC, NVML), and neither the agent nor the kubectl plugin imports
it: import-linter contracts keep it so.
"""
