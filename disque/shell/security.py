"""The node's protections in one place: cluster bus secrets, TLS contexts,
protected mode, client output limits, and the counters INFO shows.

Theory of operation: the server makes one `Security` at start-up from the
configuration (a `SecurityError` there stops the node with its message) and
hands it to the bus.  It holds what is derived from the configuration (the
`Keyring` of bus secrets, the TLS `Contexts`) and rebuilds it when CONFIG SET
changes one of its directives, restoring the old values if the new ones are
unusable.  The decisions the shell makes per connection are plain functions
here (`protected_mode_refuses`, `output_limit_exceeded`) so they can be
tested without sockets.

CONFIG SET of `cluster-secret`, `cluster-secret-file` and
`cluster-secret-previous` is a start-up operation: it is accepted only while
the node knows no other node and has no bus connection open (a fresh node, or
one after CLUSTER RESET), and refused otherwise, because changing the secret
of a live node would silently cut it off.  Secrets are rolled by restarting
nodes one at a time with the new `cluster-secret` and the old one as
`cluster-secret-previous` (see docs/security.md).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, fields
from typing import Any

from disque.shell import tls
from disque.cluster.auth import Keyring
from disque.core.errors import err

log = logging.getLogger("disque")

MIN_SECRET_LENGTH = 16  # shorter secrets are accepted with a warning
LOG_INTERVAL = 1.0  # seconds between two logged events of one kind

SECRET_ATTRS = ("cluster_secret", "cluster_secret_file", "cluster_secret_previous")
TLS_ATTRS = ("tls_cert_file", "tls_key_file", "tls_ca_cert_file", "tls_auth_clients", "tls_protocols", "tls_ciphers")

DENIED = (
    b"-DENIED Disque is running in protected mode because protected mode is enabled and no password is set. "
    b"In this mode connections are only accepted from the loopback interface. If you want to connect from "
    b"external computers to Disque you may adopt one of the following solutions: 1) Just disable protected "
    b"mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to "
    b"Disque from the same host the server is running, however MAKE SURE Disque is not publicly accessible "
    b"from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can "
    b"just disable the protected mode by editing the Disque configuration file, and setting the protected "
    b"mode option to 'no', and then restarting the server. 3) If you started the server manually just for "
    b"testing, restart it with the '--protected-mode no' option. 4) Set up an authentication password "
    b"(requirepass). NOTE: You only need to do one of the above things in order for the server to start "
    b"accepting connections from the outside.\r\n"
)


class SecurityError(Exception):
    """A security setting the node cannot start with."""


# --------------------------------------------------------------------------
# Decisions


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 and IPv4-mapped loopback addresses."""
    try:
        addr = ipaddress.ip_address(ip.partition("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def bus_protected_mode_refuses(config: Any, secured: bool, peer_ip: str, known: Callable[[], Container[str]]) -> bool:
    """`cluster-protected-mode yes` (the default): on a bus that is neither
    authenticated (cluster secret) nor TLS, accept connections only from
    loopback and from the addresses of nodes this node knows or was told
    to MEET (`known`: computed only when needed)."""
    return bool(config.cluster_protected_mode) and not secured and not is_loopback(peer_ip) and peer_ip not in known()


def protected_mode_refuses(protected_mode: bool, requirepass: str | None, peer_ip: str) -> bool:
    """Whether a new client from `peer_ip` gets DENIED: protected mode is on,
    no password is set, and the client is not on the loopback interface."""
    return protected_mode and not requirepass and not is_loopback(peer_ip)


def output_limit_exceeded(
    size: int, limits: tuple[int, int, int], soft_since: float | None, now: float
) -> tuple[bool, float | None]:
    """`client-output-buffer-limit normal <hard> <soft> <secs>` for `size`
    pending output bytes: (close the client?, new soft-limit start time).

    As in Redis: at or over the hard limit closes at once; at or over the
    soft limit closes once it has been so for more than `secs` seconds (the
    first time it is seen starts the clock); 0 disables a limit."""
    hard, soft, seconds = limits
    if hard and size >= hard:
        return True, soft_since
    if soft and size >= soft:
        if soft_since is None:
            return False, now
        return now - soft_since > seconds, soft_since
    return False, None


def announced_port(config: Any) -> int:
    """The client port the node announces to the cluster, whose bus port is
    this + 10000: `port`, or `tls-port` when the node serves TLS only."""
    return int(config.port or config.tls_port)


# --------------------------------------------------------------------------
# Secrets


def read_secret_file(path: str) -> str:
    """The secret in `path`: its content without surrounding blanks."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            secret = f.read().strip()
    except OSError as e:
        raise SecurityError(f"Can't read cluster-secret-file {path}: {e.strerror}") from None
    if not secret:
        raise SecurityError(f"cluster-secret-file {path} is empty")
    return secret


def keyring_from_config(config: Any) -> Keyring | None:
    """The bus secrets of `config`, None when bus authentication is off."""
    secret, path, previous = config.cluster_secret, config.cluster_secret_file, config.cluster_secret_previous
    if secret and path:
        raise SecurityError("cluster-secret and cluster-secret-file are both set: use one of them")
    if path:
        secret = read_secret_file(path)
    if not secret:
        if previous:
            raise SecurityError("cluster-secret-previous is set but cluster-secret is not")
        return None
    if len(secret.encode("utf-8", "surrogateescape")) < MIN_SECRET_LENGTH:
        log.warning("WARNING: the cluster secret is shorter than %d bytes: use a long random one", MIN_SECRET_LENGTH)
    return Keyring(secret, previous)


# --------------------------------------------------------------------------
# Counters


@dataclass
class SecurityStats:
    """Counters shown in the # Security section of INFO (docs/security.md)."""

    cluster_auth_handshakes_ok: int = 0
    cluster_auth_handshakes_failed: int = 0  # wrong secret, bad proof, aborted or timed out
    cluster_auth_unauthenticated_peers: int = 0  # a peer spoke without authenticating (no secret)
    cluster_auth_bad_mac_frames: int = 0
    cluster_auth_replayed_frames: int = 0
    cluster_auth_out_of_sequence_frames: int = 0
    cluster_auth_oversized_frames: int = 0
    tls_client_handshake_failures: int = 0
    tls_cluster_handshake_failures: int = 0
    protected_mode_refused_clients: int = 0
    cluster_protected_mode_refused: int = 0  # bus connections from unknown addresses, no secret
    cluster_unidentified_closed: int = 0  # bus connections closed before a valid frame (late, or over the cap)
    output_limit_closed_clients: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


# Which counter an AuthError kind bumps.
AUTH_COUNTERS = {
    "handshake": "cluster_auth_handshakes_failed",
    "plaintext": "cluster_auth_unauthenticated_peers",
    "mac": "cluster_auth_bad_mac_frames",
    "replay": "cluster_auth_replayed_frames",
    "sequence": "cluster_auth_out_of_sequence_frames",
    "size": "cluster_auth_oversized_frames",
}


class RateLimitedLog:
    """At most one message per `interval` for each event kind; the others are counted."""

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, kind: str, level: int, fmt: str, *args: Any) -> None:
        now = self.clock()
        if now < self._last.get(kind, float("-inf")) + self.interval:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return
        skipped = self._skipped.pop(kind, 0)
        if skipped:
            fmt += " (%d similar messages suppressed)"
            args += (skipped,)
        log.log(level, fmt, *args)
        self._last[kind] = now


# --------------------------------------------------------------------------
# The node's security state


class Security:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.stats = SecurityStats()
        self.log = RateLimitedLog()
        self.keyring = keyring_from_config(config)
        try:
            self.tls = tls.contexts_from_config(config)
        except tls.TLSConfigError as e:
            raise SecurityError(str(e)) from None
        if config.tls_cluster and not announced_port(config):
            raise SecurityError("tls-cluster needs a cluster bus: set port or tls-port")
        self._applied = {attr: getattr(config, attr) for attr in SECRET_ATTRS + TLS_ATTRS}

    @property
    def bus_tls(self) -> bool:
        return self.tls.bus_server is not None

    def apply_config(self, changed: list[str], can_change_secret: Callable[[], bool]) -> None:
        """React to CONFIG SET; on refusal the old values are restored and a
        DisqueError raised."""
        if any(attr in SECRET_ATTRS for attr in changed):
            if not can_change_secret():
                self._restore(SECRET_ATTRS)
                raise err("cluster-secret can only be changed at start-up, before the node joins a cluster")
            try:
                self.keyring = keyring_from_config(self.config)
            except SecurityError as e:
                self._restore(SECRET_ATTRS)
                raise err(str(e)) from None
            self._remember(SECRET_ATTRS)
            log.warning("Cluster bus authentication %s", "enabled" if self.keyring else "disabled")
        if any(attr in TLS_ATTRS for attr in changed):
            try:
                self.tls = tls.contexts_from_config(self.config)
            except tls.TLSConfigError as e:
                self._restore(TLS_ATTRS)
                raise err(str(e)) from None
            self._remember(TLS_ATTRS)
            log.info("TLS configuration reloaded")

    def _restore(self, attrs: tuple[str, ...]) -> None:
        for attr in attrs:
            setattr(self.config, attr, self._applied[attr])

    def _remember(self, attrs: tuple[str, ...]) -> None:
        for attr in attrs:
            self._applied[attr] = getattr(self.config, attr)

    def count_auth_error(self, kind: str) -> None:
        name = AUTH_COUNTERS.get(kind, "cluster_auth_handshakes_failed")
        setattr(self.stats, name, getattr(self.stats, name) + 1)

    def info_fields(self, links: tuple[int, int] = (0, 0)) -> list[tuple[str, Any]]:
        """INFO # Security; `links` = (authenticated bus connections open,
        those of them that use cluster-secret-previous)."""
        c = self.config
        ring = self.keyring
        yes_no = {True: "yes", False: "no"}
        out: list[tuple[str, Any]] = [
            ("protected_mode", yes_no[bool(c.protected_mode)]),
            ("requirepass", yes_no[bool(c.requirepass)]),
            ("client_timeout", c.timeout),
            ("client_output_buffer_limit", "normal {} {} {}".format(*c.client_output_buffer_limit)),
            ("cluster_auth", yes_no[ring is not None]),
            ("cluster_auth_secrets", len(ring.secrets) if ring else 0),
            ("cluster_auth_links", links[0]),
            ("cluster_auth_links_previous_secret", links[1]),
            ("tls_port", c.tls_port),
            ("tls_cluster", yes_no[bool(c.tls_cluster)]),
            ("tls_auth_clients", c.tls_auth_clients),
        ]
        out += [(f.name, getattr(self.stats, f.name)) for f in fields(self.stats)]
        return out
