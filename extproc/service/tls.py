"""TLS for the gRPC port: a gateway reaches an endpoint picker over TLS (Envoy AI Gateway's
generated cluster speaks TLS with an empty validation context: encrypted, not verified).

``server.tls.enabled`` without files makes a self-signed certificate at start, as the reference
endpoint picker does. With ``cert_file`` / ``key_file`` the files are read again whenever they
change (gRPC asks for the certificate at every new handshake; a rotated Kubernetes Secret swaps
the files under their mount), so a renewed certificate needs no restart; a half-written or
unreadable pair keeps the last good one.

``client_ca_file`` makes it mutual: a caller must present a client certificate that chains to
that CA, or the handshake fails (``require_client_auth``); the CA file is watched the same way.
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


class CaFile:
    """PEM CA certificates on disk, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._stamp = self._stat()
        self.pem = self._read()

    def _stat(self) -> tuple[int, int, int]:
        found = os.stat(self._path)
        return found.st_ino, found.st_mtime_ns, found.st_size

    def _read(self) -> bytes:
        pem = self._path.read_bytes()
        if b"CERTIFICATE" not in pem:
            raise ValueError(f"{self._path}: not a PEM certificate")
        return pem

    def changed(self) -> bytes | None:
        """The new CA if the file changed since last read and reads well, else None."""
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            pem = self._read()
        except (OSError, ValueError) as exc:
            log.warning("client CA unreadable, keeping the last one: %s", exc)
            return None
        self._stamp, self.pem = stamp, pem
        log.info("client CA reloaded from %s", self._path)
        return pem


def server_credentials(tls: Tls) -> tuple[grpc.ServerCredentials, CertificateFiles | None]:
    """Credentials for ``add_secure_port``, and the watched files (None: self-signed). With
    ``client_ca_file`` a caller must present a certificate that CA signed."""
    ca = CaFile(tls.client_ca_file) if tls.client_ca_file else None
    files = None
    if tls.cert_file is None or tls.key_file is None:
        pair = self_signed()
    else:
        files = CertificateFiles(tls.cert_file, tls.key_file)
        pair = files.pair
    current = [pair]

    def configuration() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [current[0]], root_certificates=None if ca is None else ca.pem)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Both are looked at: a new CA must not wait for a new certificate.
        new_pair = files.changed() if files is not None else None
        new_ca = ca.changed() if ca is not None else None
        if new_pair is None and new_ca is None:
            return None
        if new_pair is not None:
            current[0] = new_pair
        return configuration()

    credentials = grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=ca is not None)
    return credentials, files
