"""schedext's service shell: HTTP routes, settings, Kubernetes I/O and the CLI.

Routes decode a request, call one method of :class:`extender.scheduler.Scheduler`, and encode
the answer; everything that decides lives in the pure core (``extender/``).
"""

__version__ = "0.1.0"
