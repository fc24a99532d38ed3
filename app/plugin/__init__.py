"""``kubectl schedext``: a kubectl plugin that reads schedext's read-only views through the
API server's service proxy (:mod:`~app.plugin.access`) and prints them
(:mod:`~app.plugin.tables`); :mod:`~app.plugin.command` is the console script. A client of
schedext, never a part of the service (an import-linter contract keeps it so)."""
