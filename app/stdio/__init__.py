"""What every schedext process does with its standard streams: JSON logs on stderr
(:mod:`~app.stdio.logs`), and a quiet end when the reader of its stdout goes away
(:mod:`~app.stdio.pipes`). Shared by the service, the agent, the plugin and the CLI; imports
nothing of ``app``."""
