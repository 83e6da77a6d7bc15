"""Cluster bus authentication: a shared secret, a challenge-response
handshake and a MAC with a sequence number on every frame.  No I/O here: the
bus feeds received bytes in and sends what comes out.

Theory of operation
-------------------
Every node of a cluster is configured with the same `cluster-secret` (and,
while secrets are being rolled, the `cluster-secret-previous` one).  From each
secret HKDF-SHA256 derives a public 8-byte key ID and a handshake key; the
secret itself never crosses the wire.

A link starts with four handshake messages, framed like bus frames (a 4-byte
big-endian length, then the body) so that the same length prefix serves both
phases.  Bodies start with the magic `DQA1` and a one-letter type:

    initiator -> acceptor  H  nonce_i (32) | n (1) | n key IDs (8 each)
    acceptor  -> initiator C  nonce_a (32) | chosen key ID (8)
    initiator -> acceptor  P  HMAC(hk, "initiator" | H | C)
    acceptor  -> initiator A  HMAC(hk, "acceptor" | H | C | P)

The acceptor picks the first of its own secrets (current one first) whose key
ID the initiator offered, and refuses the link if there is none.  The
initiator proves that it knows the secret first, so a stranger that connects
learns nothing but a fresh nonce; the acceptor proves it in turn, so a node
that dials an impostor finds out before sending anything.  Fresh nonces from
both sides make every handshake unique: a recorded one cannot be played again.

Both sides then derive two session keys from the secret and both nonces
(HKDF, one key per direction, so a frame cannot be reflected back to its
sender).  Every frame after the handshake is

    length (4) | sequence number (8) | body | HMAC-SHA256(direction key, seq | body) (32)

where the length covers everything after it and the body is the msgpack body
of `codec.encode_body`.  Each direction numbers its frames 0, 1, 2, ...; the
receiver checks the MAC first (constant time), then requires the exact next
number.  The transport is an ordered stream, so the replay window is zero
wide: a lower number is a replayed frame, a higher one a dropped or reordered
one, and both, like a bad MAC, end the link.  A frame captured on one link
does not verify on another, whose keys differ.

Errors are `AuthError`s whose `kind` tells the bus which counter to bump:
"handshake" (no common secret, bad proof, malformed or unexpected handshake
message), "plaintext" (the peer sent an ordinary bus frame: no secret set),
"mac", "replay", "sequence" and "size" (a frame over the size limit, or too
short to hold a sequence number and a MAC).  After any error the link cannot
be resynchronised and must be closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from hmac import compare_digest
from typing import Any

from disque.cluster.codec import MAX_FRAME

MAGIC = b"DQA1"
NONCE_SIZE = 32
KEY_ID_SIZE = 8
MAC_SIZE = 32
SEQ_SIZE = 8
PREFIX = 4
OVERHEAD = SEQ_SIZE + MAC_SIZE  # bytes an authenticated frame adds to a body (besides the prefix)
MAX_SECRETS = 4  # key IDs a hello may offer
MAX_HANDSHAKE = len(MAGIC) + 1 + NONCE_SIZE + 1 + MAX_SECRETS * KEY_ID_SIZE  # largest handshake body

_SALT = b"disque cluster bus v1"
_HELLO, _CHALLENGE, _PROOF_I, _PROOF_A = b"H", b"C", b"P", b"A"


class AuthError(Exception):
    """The peer failed to authenticate or sent a frame that does not verify."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


# cryptography is imported by the functions that use it, when a secret is
# first derived: a node without a cluster secret never loads it (8 MB of RSS
# per node, docs/performance.md "Scale").


def _hkdf(secret: bytes, info: bytes, length: int = 32, salt: bytes = _SALT) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


def _hmac_sha256(key: bytes) -> Any:
    from cryptography.hazmat.primitives import hashes, hmac

    return hmac.HMAC(key, hashes.SHA256())


def _mac(key: bytes, *parts: bytes) -> bytes:
    h = _hmac_sha256(key)
    for part in parts:
        h.update(part)
    return h.finalize()


@dataclass(frozen=True, slots=True)
class Secret:
    """One cluster secret and what is derived from it."""

    ikm: bytes  # the secret itself, input of the session key derivation
    key_id: bytes  # public: lets two nodes agree on a secret without showing it
    proof_key: bytes  # handshake MACs
    previous: bool = False  # configured as cluster-secret-previous

    @classmethod
    def derive(cls, secret: bytes | str, previous: bool = False) -> Secret:
        ikm = secret.encode("utf-8", "surrogateescape") if isinstance(secret, str) else secret
        if not ikm:
            raise ValueError("an empty cluster secret")
        return cls(ikm, _hkdf(ikm, b"key id", KEY_ID_SIZE), _hkdf(ikm, b"handshake"), previous)


class Keyring:
    """The secrets a node accepts, its current one first."""

    def __init__(self, current: bytes | str, previous: bytes | str | None = None) -> None:
        secrets = [Secret.derive(current)]
        if previous:
            prev = Secret.derive(previous, previous=True)
            if prev.key_id != secrets[0].key_id:
                secrets.append(prev)
        self.secrets: tuple[Secret, ...] = tuple(secrets)

    def key_ids(self) -> list[bytes]:
        return [s.key_id for s in self.secrets]

    def by_id(self, key_id: bytes) -> Secret | None:
        return next((s for s in self.secrets if s.key_id == key_id), None)


class _Direction:
    """Keyed HMAC and the sequence number of one direction of a link."""

    __slots__ = ("_hmac", "seq")

    def __init__(self, key: bytes) -> None:
        self._hmac = _hmac_sha256(key)
        self.seq = 0

    def mac(self, seq: bytes, body: bytes | memoryview) -> bytes:
        h = self._hmac.copy()
        h.update(seq)
        h.update(body)
        return h.finalize()

    def verify(self, seq: bytes, body: bytes | memoryview, mac: bytes) -> bool:
        return compare_digest(self.mac(seq, body), mac)


class AuthLink:
    """The authentication state of one bus connection (either end).

    Use: `data_to_send()` after creating it and after every `next_body()`
    call, and send what it returns; `receive_data()` whatever arrives, then
    call `next_body()` until it returns None (more data needed).  Before the
    handshake completes `next_body()` only advances the handshake; then it
    returns the authenticated frame bodies in order.  `seal(body)` frames a
    body to send, once `established`.  Every error raises `AuthError`.
    """

    def __init__(
        self,
        keyring: Keyring,
        *,
        initiator: bool,
        max_frame: int = MAX_FRAME,
        random: Callable[[int], bytes],
    ) -> None:
        self.keyring = keyring
        self.initiator = initiator
        self.max_frame = max_frame
        self.established = False
        self.secret: Secret | None = None  # the secret the link agreed on
        self._nonce = random(NONCE_SIZE)
        self._peer_nonce = b""
        self._buf = bytearray()
        self._out = bytearray()
        self._transcript: list[bytes] = []
        self._send: _Direction | None = None
        self._recv: _Direction | None = None
        if initiator:
            ids = keyring.key_ids()[:MAX_SECRETS]
            self._emit(_HELLO + self._nonce + bytes([len(ids)]) + b"".join(ids))
            self._state = "challenge"  # what we expect next
        else:
            self._state = "hello"

    # ------------------------------------------------------------ I/O

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def seal(self, body: bytes) -> bytes:
        """The authenticated frame carrying `body`."""
        send = self._send
        if send is None:
            raise RuntimeError("the handshake is not complete")
        seq = send.seq.to_bytes(SEQ_SIZE, "big")
        send.seq += 1
        return (SEQ_SIZE + len(body) + MAC_SIZE).to_bytes(PREFIX, "big") + seq + body + send.mac(seq, body)

    def handshake_step(self) -> None:
        """Process the buffered handshake messages, and nothing after the
        handshake: frames that follow it stay buffered for `next_body`."""
        while not self.established:
            payload = self._next_payload(MAX_HANDSHAKE)
            if payload is None:
                return
            self._handshake(payload)

    def next_body(self) -> bytes | None:
        self.handshake_step()
        if not self.established:
            return None
        payload = self._next_payload(self.max_frame + OVERHEAD)
        if payload is None:
            return None
        if len(payload) < OVERHEAD:
            raise AuthError("size", f"a frame of {len(payload)} bytes cannot hold a sequence number and a MAC")
        view = memoryview(payload)
        seq, body, mac = view[:SEQ_SIZE], view[SEQ_SIZE:-MAC_SIZE], view[-MAC_SIZE:]
        recv = self._recv
        assert recv is not None
        if not recv.verify(bytes(seq), body, bytes(mac)):
            raise AuthError("mac", f"frame {recv.seq} has a bad MAC (forged or corrupted)")
        number = int.from_bytes(seq, "big")
        if number != recv.seq:
            if number < recv.seq:
                raise AuthError("replay", f"replayed frame: sequence number {number}, expected {recv.seq}")
            raise AuthError("sequence", f"frame out of sequence: number {number}, expected {recv.seq}")
        recv.seq += 1
        return bytes(body)

    # ------------------------------------------------------------ internals

    def _emit(self, message: bytes) -> None:
        body = MAGIC + message
        self._transcript.append(body)
        self._out += len(body).to_bytes(PREFIX, "big") + body

    def _next_payload(self, limit: int) -> bytes | None:
        buf = self._buf
        if len(buf) < PREFIX:
            return None
        size = int.from_bytes(buf[:PREFIX], "big")
        if size > limit:
            if self.established:
                raise AuthError("size", f"frame of {size} bytes exceeds the {limit} byte limit")
            if len(buf) < PREFIX + len(MAGIC):
                return None  # a few more bytes tell a plain bus frame from a bad handshake
            if bytes(buf[PREFIX : PREFIX + len(MAGIC)]) != MAGIC:
                raise AuthError("plaintext", "the peer did not authenticate (is its cluster-secret set?)")
            raise AuthError("handshake", f"handshake message of {size} bytes")
        end = PREFIX + size
        if len(buf) < end:
            return None
        payload = bytes(buf[PREFIX:end])
        del buf[:end]
        return payload

    def _handshake(self, body: bytes) -> None:
        if not body.startswith(MAGIC):
            raise AuthError("plaintext", "the peer did not authenticate (is its cluster-secret set?)")
        kind, data = body[len(MAGIC) : len(MAGIC) + 1], body[len(MAGIC) + 1 :]
        expected = {"hello": _HELLO, "challenge": _CHALLENGE, "proof_i": _PROOF_I, "proof_a": _PROOF_A}[self._state]
        if kind != expected:
            raise AuthError("handshake", f"unexpected handshake message {kind!r} (expected {expected!r})")
        if self._state == "hello":
            self._on_hello(body, data)
        elif self._state == "challenge":
            self._on_challenge(body, data)
        elif self._state == "proof_i":
            self._on_proof_i(body, data)
        else:
            self._on_proof_a(data)

    def _on_hello(self, body: bytes, data: bytes) -> None:
        if len(data) < NONCE_SIZE + 1:
            raise AuthError("handshake", "truncated hello")
        count = data[NONCE_SIZE]
        ids = data[NONCE_SIZE + 1 :]
        if count == 0 or count > MAX_SECRETS or len(ids) != count * KEY_ID_SIZE:
            raise AuthError("handshake", "malformed hello")
        offered = {ids[i : i + KEY_ID_SIZE] for i in range(0, len(ids), KEY_ID_SIZE)}
        secret = next((s for s in self.keyring.secrets if s.key_id in offered), None)
        if secret is None:
            raise AuthError("handshake", "no common cluster secret (wrong cluster-secret?)")
        self.secret = secret
        self._peer_nonce = data[:NONCE_SIZE]
        self._transcript.append(body)
        self._emit(_CHALLENGE + self._nonce + secret.key_id)
        self._state = "proof_i"

    def _on_challenge(self, body: bytes, data: bytes) -> None:
        if len(data) != NONCE_SIZE + KEY_ID_SIZE:
            raise AuthError("handshake", "malformed challenge")
        secret = self.keyring.by_id(data[NONCE_SIZE:])
        if secret is None:
            raise AuthError("handshake", "the peer chose a secret we did not offer")
        self.secret = secret
        self._peer_nonce = data[:NONCE_SIZE]
        self._transcript.append(body)
        self._emit(_PROOF_I + _mac(secret.proof_key, b"initiator", *self._transcript))
        self._state = "proof_a"

    def _on_proof_i(self, body: bytes, data: bytes) -> None:
        secret = self.secret
        assert secret is not None
        if not compare_digest(data, _mac(secret.proof_key, b"initiator", *self._transcript)):
            raise AuthError("handshake", "bad proof: the peer does not know the cluster secret")
        self._transcript.append(body)
        self._emit(_PROOF_A + _mac(secret.proof_key, b"acceptor", *self._transcript))
        self._establish()

    def _on_proof_a(self, data: bytes) -> None:
        secret = self.secret
        assert secret is not None
        if not compare_digest(data, _mac(secret.proof_key, b"acceptor", *self._transcript)):
            raise AuthError("handshake", "bad proof: the peer does not know the cluster secret")
        self._establish()

    def _establish(self) -> None:
        secret = self.secret
        assert secret is not None
        nonce_i, nonce_a = (self._nonce, self._peer_nonce) if self.initiator else (self._peer_nonce, self._nonce)
        keys = _hkdf(secret.ikm, b"frames", 2 * MAC_SIZE, salt=_SALT + nonce_i + nonce_a)
        to_acceptor, to_initiator = _Direction(keys[:MAC_SIZE]), _Direction(keys[MAC_SIZE:])
        self._send, self._recv = (to_acceptor, to_initiator) if self.initiator else (to_initiator, to_acceptor)
        self._transcript = []
        self.established = True


def handshake_pair(keyring_i: Keyring, keyring_a: Keyring, random: Callable[[int], bytes]) -> tuple[AuthLink, AuthLink]:
    """Run a whole handshake in memory (tests, benchmarks); raises AuthError."""
    i, a = AuthLink(keyring_i, initiator=True, random=random), AuthLink(keyring_a, initiator=False, random=random)
    for _ in range(4):
        for src, dst in ((i, a), (a, i)):
            if data := src.data_to_send():
                dst.receive_data(data)
                if dst.next_body() is not None:  # pragma: no cover - no frames during a handshake
                    raise AuthError("handshake", "frame before the end of the handshake")
    return i, a
