"""Password guessing, slowed down per source address.

Theory of operation: every password a client sends (AUTH, HELLO's AUTH,
the HTTP port's, the memcache port's: all through `NodeCore.authenticate`)
asks `attempt(addr, now, ok)` when it may be answered.  Failures are counted
per source address (an IPv4 address, or the /64 of an IPv6 one), across
connections and ports, so a new connection per guess gains nothing.

An address's first FREE_TRIES failures are answered at once.  After that the
address has a *next slot*: each attempt from it, right or wrong, is answered
no sooner than that slot, and each further failure moves the slot on by a
delay that doubles from the first of DELAY_MS up to the second.  Guesses sent
in parallel over many connections are thus answered one after the other, and
a right one among them no sooner than a wrong one would be.  An attempt from
an address whose next slot is more than the longest delay away is refused
without its password being looked at (REFUSED): guesses cannot pile up
behind each other for ever, and a refusal says nothing about the password.

A right password forgets its address; an entry is also forgotten FORGET_MS
after its last failure.  The table keeps at most MAX_ADDRESSES entries,
ordered by last failure: when it is full the oldest goes, so a client with
many addresses cannot make it grow without bound (it only buys each of them
their free tries).
"""

from __future__ import annotations

import ipaddress

FREE_TRIES = 3  # wrong passwords an address may send before its answers wait
DELAY_MS = (100, 5_000)  # the first wait, doubled with each failure up to the second
FORGET_MS = 60_000  # an address's failures are forgotten this long after its last one
MAX_ADDRESSES = 10_000  # entries kept at most (about 150 bytes each)
REFUSED = -1  # attempt(): too many attempts queued for this address; not checked


def address_key(addr: str) -> str:
    """The part of a client address ("ip:port", "[ipv6]:port") failures are
    counted by: the IP, or the /64 network of an IPv6 address."""
    if addr.startswith("["):
        host = addr[1 : addr.find("]")]
        try:
            return str(ipaddress.IPv6Network((host.partition("%")[0], 64), strict=False))
        except ValueError:
            return host
    return addr.rpartition(":")[0] or addr


class AuthThrottle:
    __slots__ = ("addresses",)

    def __init__(self) -> None:
        # address key -> [failures, next slot (ms), last failure (ms)], oldest failure first
        self.addresses: dict[str, list[int]] = {}

    def attempt(self, addr: str, now: int, ok: bool) -> int:
        """An attempt from `addr` at `now` whose password is right if `ok`: the
        ms its answer must wait, or REFUSED (then `ok` was not used)."""
        key = address_key(addr)
        entry = self.addresses.get(key)
        if entry is not None and now - entry[2] >= FORGET_MS:
            del self.addresses[key]
            entry = None
        first, cap = DELAY_MS
        slot = now if entry is None else max(now, entry[1])
        if slot - now > cap:
            return REFUSED
        if ok:
            self.addresses.pop(key, None)
            return slot - now
        if entry is None:
            self._make_room(now)
            entry = [0, now, now]
        else:
            del self.addresses[key]  # back in at the end: the newest failure
        self.addresses[key] = entry
        entry[0] += 1
        entry[2] = now
        late = entry[0] - FREE_TRIES
        if late > 0:
            slot += min(first << min(late - 1, 16), cap)
        entry[1] = slot
        return slot - now

    def _make_room(self, now: int) -> None:
        """Drop the expired entries, and the oldest while the table is full."""
        addresses = self.addresses
        while addresses:
            key = next(iter(addresses))
            if now - addresses[key][2] < FORGET_MS and len(addresses) < MAX_ADDRESSES:
                return
            del addresses[key]
