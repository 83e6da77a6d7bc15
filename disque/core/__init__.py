"""The sans-IO core: `node.NodeCore` is its entry (requests, bus messages,
ticks in; results and effects out), driven by an injected clock and random
source.  Nothing here imports trio, sockets, files or the system clock."""
