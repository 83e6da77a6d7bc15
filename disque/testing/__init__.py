"""What the test suite and jepsen-lite share with the package, as trio.testing
does: the history checkers (checker: queue semantics; checker_groups:
consumer groups; checker_stats: latency, throughput and fault windows) and the local
clusters of real node processes (devcluster: `make run`, the integration
tests, the benchmarks, jepsen-lite).
Nothing in the server imports it."""
