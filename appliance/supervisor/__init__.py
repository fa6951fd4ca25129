"""The supervisor process (``appliance run``): a pre-fork arbiter that owns the process table and
the shared resources. Nothing here runs in a worker (but ``child``, the first moments of each
forked child), and no module below the supervisor imports this package.

Modules, by concern:

- ``supervisor``: ``Supervisor``, its set-up, its loop (signals, admin requests, reaping,
  heartbeats, restarts with backoff, the drain) and its process table;
- ``process_table``: a worker's row (``WorkerSpec``) and ``ProcessTable``, the interface through
  which topic administration changes the table;
- ``topic_admin``: CreateTopics, CreatePartitions, DeleteTopics, AlterConfigs (``TopicAdmin``);
- ``memory``: whether more partitions fit the machine, for CreateTopics and for the start;
- ``dirs``: the data dir's lock and ``meta.properties``, the runtime dir (``SupervisorDirs``);
- ``reserve``: the data dir's disk reserve (``DiskReserve``);
- ``startup``: the listening sockets and the open-files limit;
- ``operating``: recovery progress, systemd's STATUS= line and watchdog, the supervisor's metrics,
  the reload of the configuration (``Operating``); ``systemd``: the notify protocol;
- ``child``: a forked worker's first moments, up to its entry point.
"""

from .supervisor import Supervisor

__all__ = ["Supervisor"]
