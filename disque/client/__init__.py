"""Python client for Disque: a synchronous `Client` and an `AsyncClient` on
anyio, so it runs under asyncio and trio alike.

Theory of operation
-------------------
Every decision is written once, as generators that yield four I/O
operations (`_Open` an address, `_Send` bytes, `_Receive` bytes, `_Close` a
connection) and get their results back; the two client classes differ only in
the small driver that carries those operations out (blocking sockets, or anyio
streams) and in how a worker runs a handler next to its WORKING heartbeats.
`disque.client.worker` builds the deployable worker on `AsyncClient`.  Under the generators
sit plain objects with no I/O: `encode_command` builds RESP requests, one
`hiredis.Reader` per connection decodes replies, `Hello` parses HELLO into
nodes sorted by priority, `NodePlanner` decides which node to try next, and
`Affinity` counts where consumed jobs were created.

The Disque client protocol:

* Connect to a random node among the configured ones, then ask HELLO for the
  whole cluster and a priority per node (lower is better).
* When the connection breaks, or the node answers -LEAVING, reconnect:
  HELLO's nodes by priority (random among equals), then the configured
  nodes, the failed one last.  The interrupted command is sent once more on
  the new node: a blocked GETJOB simply waits there, and an ADDJOB may be
  duplicated, which at-least-once queues already tolerate.
* Affinity (opt-in): a job ID carries the first 8 characters of the creating
  node's ID.  A consumer that receives most of its jobs from another node
  moves there, where they are queued without a federation hop.

Names (queues, IDs, nodes) are `str`; job bodies are `bytes`.  Text goes on
the wire as UTF-8 with surrogateescape, so any byte string round-trips.

Security: `password=` sends AUTH on every new connection; `tls=True` (with
`tls_ca_cert`, and `tls_cert`/`tls_key` for nodes that check client
certificates) or a ready `ssl_context=` wraps every connection in TLS, in
`_open`, checking the server's certificate and host name.

The modules: `protocol` (wire format, errors, addresses), `models` (the typed
results), `base` (the generators, `NodePlanner`, `Affinity`), `sync`
(`Client`), `aio` (`AsyncClient`) and `worker` (the deployable worker, not
imported here: it loads click).  Everything a caller needs is re-exported
below, so `from disque.client import Client` is the import to write.
"""

from disque.client.aio import AsyncClient
from disque.client.base import FIRST_HEARTBEAT, Affinity, NodePlanner, Pipeline
from disque.client.models import Hello, Job, JobHandle, JobInfo, NodeInfo, QueueKeys, QueueStats
from disque.client.protocol import (
    DEFAULT_ADDRESS,
    Address,
    Arg,
    DisqueConnectionError,
    DisqueReplyError,
    ReplicationTimeout,
    connection_name,
    encode_command,
    format_address,
    parse_address,
    parse_addresses,
    parse_info,
)
from disque.client.sync import Client

__all__ = [
    "DEFAULT_ADDRESS",
    "FIRST_HEARTBEAT",
    "Address",
    "Affinity",
    "Arg",
    "AsyncClient",
    "Client",
    "DisqueConnectionError",
    "DisqueReplyError",
    "Hello",
    "Job",
    "JobHandle",
    "JobInfo",
    "NodeInfo",
    "NodePlanner",
    "Pipeline",
    "QueueKeys",
    "QueueStats",
    "ReplicationTimeout",
    "connection_name",
    "encode_command",
    "format_address",
    "parse_address",
    "parse_addresses",
    "parse_info",
]
