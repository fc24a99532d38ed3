"""Kubernetes I/O: the API client, list+watch informers, the API binder.

Everything that talks to the API server lives here, behind small interfaces, so that the
routes and the pure core never see a client object. Nothing here imports the service layer
(``app.service``, the routes, the bind workflow, ``app.cluster`` that wires these informers to
the service): an import-linter contract keeps it so.
"""
