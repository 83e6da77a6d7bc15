"""TLS: the `ssl` contexts of the client port, the cluster bus and the client
library, built from the `tls-*` directives, and `tls-keygen`.

Theory of operation: the server holds three contexts, made once at start-up
(and again when CONFIG SET changes a `tls-*` file or option): `clients` for the
`tls-port` listener, and `bus_server` / `bus_client` for the two ends of a bus
link when `tls-cluster yes`.  trio's `SSLStream` wraps accepted and dialled
TCP streams with them, so a context change applies to the next connection.

* Client port: the node's certificate (`tls-cert-file`, `tls-key-file`);
  client certificates are required (`tls-auth-clients yes`, the default, as in
  Redis), checked when sent (`optional`) or not asked for (`no`), against
  `tls-ca-cert-file`.
* Bus: mutual TLS, always.  Each node presents its certificate on both ends
  and requires one signed by the CA from its peer.  Peers are dialled by IP
  and node certificates rarely list every address, so the bus trusts the CA
  and does not match host names (as Redis does).
* `tls-protocols` ("TLSv1.2 TLSv1.3", any of TLSv1, TLSv1.1, TLSv1.2,
  TLSv1.3) bounds the versions, TLS 1.2 and up when unset; `tls-ciphers` is an
  OpenSSL cipher list for TLS 1.2 and below.

`keygen(dir)` writes a throwaway CA and a node and a client certificate for
development and tests; nothing here is meant to manage real certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_VERSIONS = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
_VERIFY = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}


class TLSConfigError(ValueError):
    """A TLS setting that cannot be used; the text says which and why."""


def _protocols(ctx: ssl.SSLContext, spec: str | None) -> None:
    if not spec:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return
    try:
        versions = sorted(_VERSIONS[word.lower()] for word in spec.split())
    except KeyError as e:
        raise TLSConfigError(f"Invalid tls-protocols: unknown protocol {e.args[0]!r}") from None
    if not versions:
        raise TLSConfigError("Invalid tls-protocols: no protocol given")
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]


def _common(ctx: ssl.SSLContext, protocols: str | None, ciphers: str | None) -> None:
    _protocols(ctx, protocols)
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError:
            raise TLSConfigError(f"Invalid tls-ciphers: {ciphers!r}") from None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise TLSConfigError(f"Failed to load certificate {cert} / key {key}: {_why(e)}") from None


def _load_ca(ctx: ssl.SSLContext, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise TLSConfigError(f"Failed to load CA certificate(s) {ca}: {_why(e)}") from None


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


def server_context(
    cert: str,
    key: str | None,
    *,
    ca: str | None = None,
    verify: str = "no",
    protocols: str | None = None,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    """A server-side context; `verify` is yes, optional or no (client certificates)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(ctx, protocols, ciphers)
    _load_chain(ctx, cert, key)
    if verify != "no":
        if not ca:
            raise TLSConfigError("Verifying client certificates needs tls-ca-cert-file")
        _load_ca(ctx, ca)
    ctx.verify_mode = _VERIFY[verify]
    return ctx


def client_context(
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    check_hostname: bool = True,
    protocols: str | None = None,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    """A client-side context: the server is verified against `ca` (the system
    CAs when None); `cert`/`key` are presented when the server asks."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(ctx, protocols, ciphers)
    if ca:
        _load_ca(ctx, ca)
    else:
        ctx.load_default_certs()
    if cert:
        _load_chain(ctx, cert, key)
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True)
class Contexts:
    """What a node needs; None where that side does not use TLS."""

    clients: ssl.SSLContext | None = None
    bus_server: ssl.SSLContext | None = None
    bus_client: ssl.SSLContext | None = None


def contexts_from_config(config: Any) -> Contexts:
    """The node's contexts; raises TLSConfigError when the settings are unusable."""
    wants_clients, wants_bus = bool(config.tls_port or config.memcache_tls_port), bool(config.tls_cluster)
    if not (wants_clients or wants_bus):
        return Contexts()
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_ca_cert_file
    if not cert or not key:
        what = ("tls-port" if config.tls_port else "memcache-tls-port") if wants_clients else "tls-cluster"
        raise TLSConfigError(f"{what} needs tls-cert-file and tls-key-file")
    options = {"protocols": config.tls_protocols, "ciphers": config.tls_ciphers}
    clients = bus_server = bus_client = None
    if wants_clients:
        clients = server_context(cert, key, ca=ca, verify=config.tls_auth_clients, **options)
    if wants_bus:
        if not ca:
            raise TLSConfigError("tls-cluster needs tls-ca-cert-file to verify the other nodes")
        bus_server = server_context(cert, key, ca=ca, verify="yes", **options)
        bus_client = client_context(ca=ca, cert=cert, key=key, check_hostname=False, **options)
    return Contexts(clients, bus_server, bus_client)


# --------------------------------------------------------------------------
# tls-keygen


def keygen(
    directory: str | os.PathLike[str],
    hosts: Iterable[str] = ("localhost", "127.0.0.1", "::1"),
    days: int = 365,
) -> dict[str, Path]:
    """Write a throwaway CA and a node and a client certificate into `directory`.

    Files: ca.crt ca.key node.crt node.key client.crt client.key (keys mode
    0600, EC P-256).  The node certificate is valid for `hosts` (names or IP
    addresses) and for both server and client authentication, so the same pair
    serves the client port and both ends of the bus.  Returns name -> path.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hosts = list(hosts)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Disque development"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])  # fmt: skip

    def write(stem: str, key: Any, cert: x509.Certificate) -> None:
        key_path, cert_path = out / f"{stem}.key", out / f"{stem}.crt"
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        os.chmod(key_path, 0o600)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{stem}.key"], paths[f"{stem}.crt"] = key_path, cert_path

    paths: dict[str, Path] = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("Disque development CA"))
        .issuer_name(name("Disque development CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)  # fmt: skip
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write("ca", ca_key, ca_cert)

    def leaf(stem: str, common: str, usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)  # fmt: skip
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        write(stem, key, builder.sign(ca_key, hashes.SHA256()))

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    first = hosts[0] if hosts else "disque-node"
    leaf("node", first, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], sans)
    leaf("client", "disque-client", [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    return paths
