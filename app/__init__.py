"""schedext's shell around the pure core (``extender/``), three buildings over one floor:

- :mod:`app.service`, the extender service (``schedext serve``): the verbs, the read-only
  views, settings, metrics, and the inventory sources that feed the core;
- :mod:`app.agent`, the node agent (``schedext agent``): NVML and the kubelet's device plugin;
- :mod:`app.plugin`, the kubectl plugin (``kubectl schedext``), a client of the service's views;
- :mod:`app.kube`, the floor under all three: Kubernetes I/O;
- :mod:`app.stdio`, what every process does with its standard streams (logs, closed pipes).

:mod:`app.cli` is the front door, the ``schedext`` command, which hands each subcommand to its
building. The three buildings never import one another: import-linter contracts keep it so.
"""

__version__ = "0.1.0"
