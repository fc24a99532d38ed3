"""Kubernetes I/O, the floor the three buildings of ``app`` stand on: the API client, list+watch
informers, the binders, Events and the pod writes beside them, and whether this replica may
answer (``readiness``).

Everything that talks to the API server lives here, behind small interfaces, so that the
routes and the pure core never see a client object. Nothing here imports the extender service
(``app.service``, whose ``cluster`` wires these informers to it), the node agent or the kubectl
plugin, which all use it: import-linter contracts keep it so.
"""
