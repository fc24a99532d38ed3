"""schedext's pure scheduling core.

Values in, values out: no I/O, no clock, no logging, no web framework and no Kubernetes
client (an import-linter contract in pyproject.toml keeps it that way). The service shell in
``app/`` decodes requests, calls into this package and performs the effects it plans.
"""
