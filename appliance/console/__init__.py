"""The appliance's web console (``[console] listen``; README "Console").

Runs in the console worker (``workers/console_server.py``), which owns its HTTP connections and
calls ``app.Console.handle`` for each request. Modules, each sans-IO but for the Kafka client
and the shared-memory reads: ``http`` (request parsing, answers), ``sessions`` (logins, cookies,
CSRF), ``kafka`` (what is read and changed, over the Kafka protocol as the session's principal),
``records`` (the record browser), ``overview`` and ``history`` (processes, disk, problems, the
last hour's rates), ``app`` and ``pages`` (routes and pages), ``templates/`` and ``static/``
(Jinja2 templates; uPlot, MIT, vendored with its licence).
"""
