"""The frontend worker: client connections (``server.py``, ``connection.py``) and its channels
to the rest of the appliance (``broker.py``). ``main`` is the supervisor's entry point."""

from workers.frontend.server import main

__all__ = ["main"]
