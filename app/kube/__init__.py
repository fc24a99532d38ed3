"""Kubernetes I/O: the API client, list+watch informers, the API binder.

Everything that talks to the API server lives here, behind small interfaces, so that the
routes and the pure core never see a client object.
"""
