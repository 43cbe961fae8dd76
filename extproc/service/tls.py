"""TLS for the gRPC port: a gateway reaches an endpoint picker over TLS (Envoy AI Gateway's
generated cluster speaks TLS with an empty validation context: encrypted, not verified).

``server.tls.enabled`` without files makes a self-signed certificate at start, as the reference
endpoint picker does. With ``cert_file`` / ``key_file`` the files are read again whenever they
change (gRPC asks for the certificate at every new handshake; a rotated Kubernetes Secret swaps
the files under their mount), so a renewed certificate needs no restart; a half-written or
unreadable pair keeps the last good one.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..config import Tls

log = logging.getLogger(__name__)

SELF_SIGNED_DAYS = 365


def self_signed(hostnames: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A fresh key and a certificate for it, signed by itself: (key PEM, certificate PEM)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    names = hostnames or (socket.gethostname(), "localhost")
    certificate = _certificate(names[0], names[0], key, key, names, SELF_SIGNED_DAYS,
                               loopback=True)
    return _key_pem(key), certificate


@dataclass(frozen=True)
class Issued:
    """A server certificate and the CA that signed it (PEM); the CA's key is not kept."""

    ca: bytes
    certificate: bytes
    key: bytes


def issue(dns_names: tuple[str, ...], days: int, *, ca_name: str = "saar-extproc CA") -> Issued:
    """A new CA, and a server certificate for ``dns_names`` it signs, both valid ``days``: what
    a gateway verifies the service with (it trusts the CA and checks a DNS name)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    if not dns_names:
        raise ValueError("a certificate needs at least one DNS name")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(ca_name, ca_name, ca_key, ca_key, (), days, authority=True)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = _certificate(dns_names[0], ca_name, key, ca_key, dns_names, days,
                               issuer_certificate=ca)
    return Issued(ca, certificate, _key_pem(key))


def _certificate(subject: str, issuer: str, key: Any, signer: Any, names: tuple[str, ...],
                 days: int, *, authority: bool = False, loopback: bool = False,
                 issuer_certificate: bytes | None = None) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text[:64] or "saar")])

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
    )
    if authority:
        builder = (builder
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(
                       digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), critical=True))
    else:
        alternatives: list[x509.GeneralName] = [x509.DNSName(n) for n in names if n]
        if loopback:
            alternatives.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives),
                                        critical=False)
        if issuer_certificate is not None:
            ca = x509.load_pem_x509_certificate(issuer_certificate)
            builder = (builder
                       .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                      critical=True)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                      critical=False)
                       .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                           ca.public_key()), critical=False))  # type: ignore[arg-type]
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CertificateFiles:
    """A key and certificate pair on disk, read again when either file changes."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self._cert = Path(cert_file)
        self._key = Path(key_file)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self.pair = self._read()
        self.reloads = 0

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        # stat follows symlinks: a Secret volume swaps its ..data link, the target changes.
        stats = (os.stat(self._cert), os.stat(self._key))
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _read(self) -> tuple[bytes, bytes]:
        key, cert = self._key.read_bytes(), self._cert.read_bytes()
        if b"PRIVATE KEY" not in key or b"CERTIFICATE" not in cert:
            raise ValueError(f"{self._key} / {self._cert}: not a PEM key and certificate")
        return key, cert

    def changed(self) -> tuple[bytes, bytes] | None:
        """The new pair if the files changed since last read and read well, else None."""
        with self._lock:
            try:
                stamp = self._stat()
                if stamp == self._stamp:
                    return None
                pair = self._read()
            except (OSError, ValueError) as exc:
                log.warning("TLS files unreadable, keeping the last certificate: %s", exc)
                return None
            self._stamp, self.pair = stamp, pair
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self._cert)
            return pair


def server_credentials(tls: Tls) -> tuple[grpc.ServerCredentials, CertificateFiles | None]:
    """Credentials for ``add_secure_port``, and the watched files (None: self-signed)."""
    if tls.cert_file is None or tls.key_file is None:
        key, cert = self_signed()
        config = grpc.ssl_server_certificate_configuration([(key, cert)])
        return grpc.dynamic_ssl_server_credentials(config, lambda: None), None
    files = CertificateFiles(tls.cert_file, tls.key_file)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        pair = files.changed()
        return None if pair is None else grpc.ssl_server_certificate_configuration([pair])

    initial = grpc.ssl_server_certificate_configuration([files.pair])
    return grpc.dynamic_ssl_server_credentials(initial, fetch), files
