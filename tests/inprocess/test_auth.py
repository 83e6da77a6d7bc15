"""Cluster bus authentication without sockets (disque.cluster.auth), and the
per-connection security decisions of disque.shell.security.

Hypothesis drives the authenticated frame decoder with arbitrary chunking,
bit flips, truncations, reorderings, duplicates and garbage: it must hand out
exactly the bodies that were sealed, in order, or raise AuthError, and never
anything else.
"""

from __future__ import annotations

import os

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque.cluster.auth import (
    MAX_HANDSHAKE,
    OVERHEAD,
    PREFIX,
    AuthError,
    AuthLink,
    Keyring,
    Secret,
    handshake_pair,
)
from disque.cluster.codec import encode_frame
from disque.cluster.messages import Header, Ping
from disque.core.config import Config
from disque.shell.security import (
    SecurityError,
    announced_port,
    is_loopback,
    keyring_from_config,
    output_limit_exceeded,
    protected_mode_refuses,
)

S1, S2, S3 = "first secret of the test suite", "second secret of the test suite", "some other secret"


def pump(src: AuthLink, dst: AuthLink) -> list[bytes]:
    """Move src's pending output to dst; the bodies dst hands out."""
    dst.receive_data(src.data_to_send())
    return drain(dst)


def drain(link: AuthLink) -> list[bytes]:
    out = []
    while (body := link.next_body()) is not None:
        out.append(body)
    return out


def sealed_stream(bodies: list[bytes]) -> tuple[bytes, AuthLink, list[bytes]]:
    """A fresh link pair; the initiator's frames for `bodies` and the acceptor."""
    i, a = handshake_pair(Keyring(S1), Keyring(S1), os.urandom)
    frames = [i.seal(b) for b in bodies]
    return b"".join(frames), a, frames


def feed(link: AuthLink, data: bytes, chunks: list[int] | None = None) -> list[bytes]:
    """Feed `data` in chunks of the given sizes (cycled); all bodies out, or AuthError."""
    out: list[bytes] = []
    sizes = itertools.cycle(chunks or [len(data) or 1])
    pos = 0
    while pos < len(data):
        n = max(1, next(sizes))
        link.receive_data(data[pos : pos + n])
        pos += n
        out += drain(link)
    return out


# --------------------------------------------------------------------------
# Handshake


def test_same_secret_links_both_ways() -> None:
    i, a = handshake_pair(Keyring(S1), Keyring(S1), os.urandom)
    assert i.established and a.established
    assert i.secret is not None and a.secret is not None and i.secret.key_id == a.secret.key_id
    a.receive_data(i.seal(b"to acceptor") + i.seal(b""))
    assert drain(a) == [b"to acceptor", b""]
    i.receive_data(a.seal(b"to initiator"))
    assert drain(i) == [b"to initiator"]


def test_handshake_messages_are_small_and_framed() -> None:
    i = AuthLink(Keyring(S1, S2), initiator=True, random=os.urandom)
    hello = i.data_to_send()
    assert int.from_bytes(hello[:PREFIX], "big") == len(hello) - PREFIX <= MAX_HANDSHAKE
    assert hello[PREFIX:].startswith(b"DQA1H")
    assert S1.encode() not in hello and S2.encode() not in hello


def test_wrong_secret_is_refused_by_the_acceptor() -> None:
    with pytest.raises(AuthError) as e:
        handshake_pair(Keyring(S1), Keyring(S2), os.urandom)
    assert e.value.kind == "handshake" and "no common cluster secret" in e.value.reason


def test_no_secret_peer_is_refused_as_plaintext() -> None:
    a = AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    a.receive_data(encode_frame(Header("a" * 40, 7711, 0), Ping()))
    with pytest.raises(AuthError) as e:
        a.next_body()
    assert e.value.kind == "plaintext"


def test_large_plain_frame_is_refused_once_its_first_bytes_are_seen() -> None:
    a = AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    frame = (5000).to_bytes(4, "big") + b"\x85" + b"x" * 100
    a.receive_data(frame[:4])
    assert a.next_body() is None  # not enough to tell yet
    a.receive_data(frame[4:])
    with pytest.raises(AuthError) as e:
        a.next_body()
    assert e.value.kind == "plaintext"


def forged(ring: Keyring) -> Keyring:
    """A keyring that offers the right key ID without knowing the secret."""
    real = ring.secrets[0]
    fake = Keyring(S3)
    fake.secrets = (Secret(b"guess", real.key_id, b"\0" * 32),)
    return fake


def test_forged_initiator_proof_is_refused() -> None:
    with pytest.raises(AuthError) as e:
        handshake_pair(forged(Keyring(S1)), Keyring(S1), os.urandom)
    assert e.value.kind == "handshake" and "bad proof" in e.value.reason


def test_impostor_acceptor_is_detected_by_the_initiator() -> None:
    i, a = AuthLink(Keyring(S1), initiator=True, random=os.urandom), AuthLink(forged(Keyring(S1)), initiator=False, random=os.urandom)
    pump(i, a)  # hello -> challenge
    pump(a, i)  # challenge -> initiator proof
    a._on_proof_i = lambda body, data: a._emit(b"A" + b"\0" * 32)  # type: ignore[method-assign]
    pump(i, a)
    with pytest.raises(AuthError) as e:
        pump(a, i)
    assert "bad proof" in e.value.reason and not i.established


def test_a_recorded_handshake_cannot_be_replayed() -> None:
    i, a = AuthLink(Keyring(S1), initiator=True, random=os.urandom), AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    recorded = [i.data_to_send()]
    a.receive_data(recorded[0])
    drain(a)
    i.receive_data(a.data_to_send())
    drain(i)
    recorded.append(i.data_to_send())
    a.receive_data(recorded[1])
    drain(a)
    assert a.established
    fresh = AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    fresh.receive_data(recorded[0])
    drain(fresh)
    fresh.receive_data(recorded[1])
    with pytest.raises(AuthError) as e:
        drain(fresh)
    assert e.value.kind == "handshake"


def test_frames_before_the_end_of_the_handshake_stay_buffered() -> None:
    i, a = AuthLink(Keyring(S1), initiator=True, random=os.urandom), AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    pump(i, a)
    pump(a, i)
    pump(i, a)  # acceptor established, its proof pending
    early = a.seal(b"early")
    i.receive_data(a.data_to_send() + early)
    i.handshake_step()
    assert i.established
    assert drain(i) == [b"early"]


def test_malformed_handshake_messages() -> None:
    for body in (b"DQA1H" + b"\0" * 32 + b"\x00", b"DQA1H" + b"\0" * 32 + b"\x05" + b"\0" * 40, b"DQA1P" + b"\0" * 32, b"DQA1H"):
        a = AuthLink(Keyring(S1), initiator=False, random=os.urandom)
        a.receive_data(len(body).to_bytes(4, "big") + body)
        with pytest.raises(AuthError) as e:
            a.next_body()
        assert e.value.kind == "handshake", body


def test_seal_before_the_handshake_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        AuthLink(Keyring(S1), initiator=True, random=os.urandom).seal(b"x")


# --------------------------------------------------------------------------
# Rotation


def test_rotation_pairs() -> None:
    rolled, old, new = Keyring(S2, S1), Keyring(S1), Keyring(S2)
    i, a = handshake_pair(rolled, old, os.urandom)
    assert i.secret is not None and i.secret.previous and a.secret is not None and not a.secret.previous
    i, a = handshake_pair(old, rolled, os.urandom)
    assert a.secret is not None and a.secret.previous
    i, a = handshake_pair(rolled, rolled, os.urandom)  # both know both: the current one wins
    assert i.secret is not None and not i.secret.previous
    i, a = handshake_pair(rolled, new, os.urandom)
    assert i.secret is not None and not i.secret.previous
    with pytest.raises(AuthError):
        handshake_pair(new, old, os.urandom)


def test_key_ids_are_stable_and_distinct() -> None:
    assert Secret.derive(S1).key_id == Secret.derive(S1.encode()).key_id
    assert Secret.derive(S1).key_id != Secret.derive(S2).key_id
    assert len(Keyring(S1, S1).secrets) == 1
    with pytest.raises(ValueError):
        Secret.derive("")


# --------------------------------------------------------------------------
# Frames: replay, reflection, reordering, tampering


def test_in_session_replay_is_rejected() -> None:
    _, a, frames = sealed_stream([b"one", b"two"])
    assert feed(a, frames[0] + frames[1]) == [b"one", b"two"]
    with pytest.raises(AuthError) as e:
        feed(a, frames[0])
    assert e.value.kind == "replay"


def test_frames_of_another_session_do_not_verify() -> None:
    _, _, frames = sealed_stream([b"one"])
    _, other, _ = sealed_stream([])
    with pytest.raises(AuthError) as e:
        feed(other, frames[0])
    assert e.value.kind == "mac"


def test_a_frame_reflected_to_its_sender_does_not_verify() -> None:
    i, _ = handshake_pair(Keyring(S1), Keyring(S1), os.urandom)
    with pytest.raises(AuthError) as e:
        feed(i, i.seal(b"echo"))
    assert e.value.kind == "mac"


def test_reordered_frames_are_rejected() -> None:
    _, a, frames = sealed_stream([b"one", b"two"])
    with pytest.raises(AuthError) as e:
        feed(a, frames[1])
    assert e.value.kind == "sequence"


def test_oversized_and_undersized_frames() -> None:
    i, a = handshake_pair(Keyring(S1), Keyring(S1), os.urandom)
    a.max_frame = 10
    with pytest.raises(AuthError) as e:
        feed(a, i.seal(b"x" * 11))
    assert e.value.kind == "size"
    _, a2, _ = sealed_stream([])
    with pytest.raises(AuthError) as e:
        feed(a2, (OVERHEAD - 1).to_bytes(4, "big") + b"\0" * (OVERHEAD - 1))
    assert e.value.kind == "size"


# --------------------------------------------------------------------------
# Hypothesis: the authenticated frame decoder

bodies_st = st.lists(st.binary(max_size=64), min_size=1, max_size=6)
chunks_st = st.lists(st.integers(min_value=1, max_value=80), min_size=1, max_size=8)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(link: AuthLink, data: bytes, chunks: list[int]) -> tuple[list[bytes], AuthError | None]:
    out: list[bytes] = []
    try:
        sizes = itertools.cycle(chunks)
        pos = 0
        while pos < len(data):
            n = next(sizes)
            link.receive_data(data[pos : pos + n])
            pos += n
            while (body := link.next_body()) is not None:
                out.append(body)
    except AuthError as e:
        return out, e
    return out, None


@FUZZ
@given(bodies_st, chunks_st)
def test_fuzz_any_chunking_round_trips(bodies: list[bytes], chunks: list[int]) -> None:
    data, a, _ = sealed_stream(bodies)
    assert outcome(a, data, chunks) == (bodies, None)


@FUZZ
@given(bodies_st, chunks_st, st.data())
def test_fuzz_a_flipped_bit_is_never_accepted(bodies: list[bytes], chunks: list[int], data: st.DataObject) -> None:
    stream, a, frames = sealed_stream(bodies)
    pos = data.draw(st.integers(0, len(stream) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(stream)
    damaged[pos] ^= 1 << bit
    out, error = outcome(a, bytes(damaged), chunks)
    frame_index = next(k for k in range(len(frames)) if sum(map(len, frames[: k + 1])) > pos)
    # Every frame before the damaged one comes out intact, nothing from it or after.
    assert out == bodies[:frame_index]
    if error is None:  # a damaged length prefix can only make the decoder wait for more
        offset = pos - sum(map(len, frames[:frame_index]))
        assert offset < PREFIX


@FUZZ
@given(bodies_st, chunks_st, st.data())
def test_fuzz_truncation_yields_a_prefix(bodies: list[bytes], chunks: list[int], data: st.DataObject) -> None:
    stream, a, frames = sealed_stream(bodies)
    cut = data.draw(st.integers(0, len(stream)), label="cut")
    out, error = outcome(a, stream[:cut], chunks)
    assert error is None
    complete = sum(1 for k in range(len(frames)) if sum(map(len, frames[: k + 1])) <= cut)
    assert out == bodies[:complete]


@FUZZ
@given(st.lists(st.binary(max_size=16), min_size=2, max_size=6), st.data())
def test_fuzz_reordered_or_duplicated_frames_stop_the_link(bodies: list[bytes], data: st.DataObject) -> None:
    _, a, frames = sealed_stream(bodies)
    order = data.draw(st.lists(st.integers(0, len(frames) - 1), min_size=1, max_size=8), label="order")
    out, error = outcome(a, b"".join(frames[k] for k in order), [1 << 16])
    good = 0
    while good < len(order) and order[good] == good:
        good += 1
    assert out == bodies[:good]
    assert (error is None) == (good == len(order))
    if error is not None:
        assert error.kind == ("replay" if order[good] < good else "sequence")


@FUZZ
@given(st.binary(max_size=300), chunks_st, st.booleans())
def test_fuzz_garbage_only_raises_auth_errors(garbage: bytes, chunks: list[int], established: bool) -> None:
    if established:
        _, link, _ = sealed_stream([])
    else:
        link = AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    out, error = outcome(link, garbage, chunks)
    assert out == [] and (error is None or isinstance(error, AuthError))


@FUZZ
@given(st.binary(min_size=1, max_size=120), st.integers(0, 3), st.booleans())
def test_fuzz_a_tampered_handshake_never_completes(junk: bytes, which: int, keep_type: bool) -> None:
    """Replace one of the four handshake messages (whole body, or all but its
    magic and type) by junk: the handshake fails or stalls, never succeeds."""
    i, a = AuthLink(Keyring(S1), initiator=True, random=os.urandom), AuthLink(Keyring(S1), initiator=False, random=os.urandom)
    try:
        for step, (src, dst) in enumerate([(i, a), (a, i), (i, a), (a, i)]):
            message = src.data_to_send()
            if step == which:
                body = message[PREFIX : PREFIX + 5] + junk if keep_type else junk
                message = len(body).to_bytes(PREFIX, "big") + body
            dst.receive_data(message)
            dst.handshake_step()
    except AuthError:
        return
    assert not (i.established and a.established)


# --------------------------------------------------------------------------
# Security decisions (disque.shell.security)


@pytest.mark.parametrize(
    ("ip", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.1", False),
     ("192.168.1.2", False), ("::ffff:10.0.0.1", False), ("2001:db8::1", False), ("fe80::1%eth0", False), ("", False)],
)  # fmt: skip
def test_is_loopback(ip: str, loopback: bool) -> None:
    assert is_loopback(ip) is loopback


def test_protected_mode_decision() -> None:
    assert protected_mode_refuses(True, None, "10.1.2.3")
    assert not protected_mode_refuses(True, None, "127.0.0.1")
    assert not protected_mode_refuses(True, "pass", "10.1.2.3")
    assert not protected_mode_refuses(False, None, "10.1.2.3")


def test_output_limits() -> None:
    limits = (1000, 500, 2)
    assert output_limit_exceeded(499, limits, None, 0.0) == (False, None)
    assert output_limit_exceeded(1000, limits, None, 0.0) == (True, None)  # the hard limit: at once
    assert output_limit_exceeded(600, limits, None, 10.0) == (False, 10.0)  # the soft clock starts
    assert output_limit_exceeded(600, limits, 10.0, 12.0) == (False, 10.0)
    assert output_limit_exceeded(600, limits, 10.0, 12.5) == (True, 10.0)
    assert output_limit_exceeded(100, limits, 10.0, 13.0) == (False, None)  # back under: reset
    assert output_limit_exceeded(10**9, (0, 0, 0), None, 0.0) == (False, None)


def test_keyring_from_config(tmp_path: Path) -> None:
    config = Config(str(tmp_path))
    assert keyring_from_config(config) is None
    config.cluster_secret, config.cluster_secret_previous = S2, S1
    ring = keyring_from_config(config)
    assert ring is not None and [s.previous for s in ring.secrets] == [False, True]
    path = tmp_path / "secret"
    path.write_text(S1 + "\n")
    config.cluster_secret, config.cluster_secret_file = None, str(path)
    ring = keyring_from_config(config)
    assert ring is not None and ring.secrets[0].key_id == Secret.derive(S1).key_id
    config.cluster_secret = S2
    with pytest.raises(SecurityError, match="both set"):
        keyring_from_config(config)
    config.cluster_secret, config.cluster_secret_file = None, str(tmp_path / "missing")
    with pytest.raises(SecurityError, match="Can't read"):
        keyring_from_config(config)
    config.cluster_secret_file, config.cluster_secret_previous = None, S1
    with pytest.raises(SecurityError, match="previous"):
        keyring_from_config(config)


def test_announced_port() -> None:
    config = Config("/")
    config.port, config.tls_port = 7711, 7712
    assert announced_port(config) == 7711
    config.port = 0
    assert announced_port(config) == 7712


# --------------------------------------------------------------------------
# Password guessing, slowed per source address (disque.core.auth_throttle)


def _addr_session(core, addr: str):
    from support import Session

    s = Session(core)
    s.client.addr = addr
    return s


def _answered_after(core, clock, s, limit_ms: int = 20_000) -> int:
    """ms until the late answer of `s` arrives (the core ticking every 10 ms)."""
    from invariants import advance

    waited = 0
    while not s.pending():
        assert waited < limit_ms, "no answer"
        advance(core, clock, 10)
        waited += 10
    return waited


def test_the_throttle_counts_per_address_and_serialises_parallel_attempts() -> None:
    from disque.core.auth_throttle import DELAY_MS, FORGET_MS, FREE_TRIES, REFUSED, AuthThrottle

    t = AuthThrottle()
    assert [t.attempt(f"10.0.0.1:{port}", 0, False) for port in range(1, FREE_TRIES + 1)] == [0] * FREE_TRIES
    # every further attempt, from any port of the address, waits behind the one before
    assert [t.attempt("10.0.0.1:9", 0, False) for _ in range(6)] == [100, 300, 700, 1500, 3100, 6300]
    assert t.attempt("10.0.0.1:9", 0, True) == REFUSED  # 6.3 s queued: not even looked at
    assert t.attempt("10.0.0.2:9", 0, False) == 0  # another address has its own count
    assert t.attempt("10.0.0.1:9", 1_400, True) == 6300 - 1_400  # right: answered at the next slot ...
    assert t.attempt("10.0.0.1:9", 6300, False) == 0  # ... and the address is forgotten
    # failures are forgotten FORGET_MS after the last one
    t2 = AuthThrottle()
    for _ in range(FREE_TRIES + 1):
        t2.attempt("10.0.0.3:1", 0, False)
    assert t2.attempt("10.0.0.3:1", DELAY_MS[0], False) == 200
    assert t2.attempt("10.0.0.3:1", DELAY_MS[0] + FORGET_MS, False) == 0


def test_the_throttle_table_is_bounded_and_ipv6_counts_by_64(monkeypatch) -> None:
    from disque.core import auth_throttle
    from disque.core.auth_throttle import FORGET_MS, AuthThrottle, address_key

    assert address_key("[2001:db8::1:2]:7711") == address_key("[2001:db8::ffff]:1") == "2001:db8::/64"
    assert address_key("[fe80::1%eth0]:5") == "fe80::/64" and address_key("[nonsense]:5") == "nonsense"
    assert address_key("192.0.2.7:7711") == "192.0.2.7" and address_key("unix") == "unix"
    monkeypatch.setattr(auth_throttle, "MAX_ADDRESSES", 100)
    t = AuthThrottle()
    for i in range(1000):
        t.attempt(f"10.1.{i // 256}.{i % 256}:1", i, False)
    assert len(t.addresses) == 100 and "10.1.3.231" in t.addresses and "10.1.0.0" not in t.addresses
    t.attempt("10.9.9.9:1", 999 + FORGET_MS, False)  # every older entry has expired meanwhile
    assert list(t.addresses) == ["10.9.9.9"]


def test_fresh_connections_share_their_address_slowdown() -> None:
    """Wrong passwords over new connections from one address are slowed as
    on one connection; another address is not; a right password waits for
    its address's slot too, then clears it."""
    from support import make_core
    from disque.core.types import BLOCKED

    core, clock, _ = make_core(requirepass="secret")
    for port in range(3):
        assert _addr_session(core, f"10.0.0.1:{port}")("AUTH", "wrong").message == "invalid password"
    delays = []
    for port in range(3, 7):
        s = _addr_session(core, f"10.0.0.1:{port}")
        assert s("AUTH", "wrong") is BLOCKED
        delays.append(_answered_after(core, clock, s))
    assert all(want <= got <= want + 100 for want, got in zip([100, 200, 400, 800], delays, strict=True)), delays
    elsewhere = _addr_session(core, "10.0.0.2:1")
    assert elsewhere("AUTH", "wrong").message == "invalid password"
    right = _addr_session(core, "10.0.0.1:99")
    assert right("AUTH", "wrong") is BLOCKED and right.client.waiter is not None  # its connection runs nothing meanwhile
    late = _addr_session(core, "10.0.0.1:100")
    assert late("AUTH", "secret") is BLOCKED  # right, but told no sooner than a wrong one would be
    assert not late.pending() and late.client.authenticated
    _answered_after(core, clock, late)
    assert late("QLEN", "q") == 0
    assert _addr_session(core, "10.0.0.1:101")("AUTH", "wrong").message == "invalid password"  # cleared


def test_a_flood_of_parallel_guesses_is_refused_unchecked_and_hello_waits_as_auth_does() -> None:
    from support import make_core
    from disque.core.types import BLOCKED

    core, clock, _ = make_core(requirepass="secret")
    guesses = [_addr_session(core, f"10.0.0.5:{port}") for port in range(20)]
    replies = [s("AUTH", "wrong") for s in guesses]
    assert [getattr(r, "message", r) for r in replies[:3]] == ["invalid password"] * 3
    assert replies[3:9] == [BLOCKED] * 6
    refused = "too many wrong passwords from this address, try again later"
    assert {r.message for r in replies[9:]} == {refused}
    assert core.stats.auth_failures == 9  # refusals are not wrong passwords
    hello = _addr_session(core, "10.0.0.5:99")
    assert hello("HELLO", "3", "AUTH", "default", "secret").message == refused
    clock.advance(5_000)
    # HELLO with the right password, waiting for its slot: its syntax error waits too
    assert hello("HELLO", "3", "AUTH", "default", "secret", "BOGUS") is BLOCKED
    _answered_after(core, clock, hello)
    ok = _addr_session(core, "10.0.0.6:1")
    assert ok("HELLO", "3", "AUTH", "default", "secret")[0] == (b"server", b"disque")
