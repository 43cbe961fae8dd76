"""Certificates for the mutual-TLS tests, made with ``cryptography``: a CA that keeps its key,
server certificates for a host name and client certificates (``clientAuth``) it signs."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM."""

    certificate: bytes
    key: bytes

    def write(self, folder: Path, name: str) -> tuple[Path, Path]:
        """``folder/name.crt`` and ``folder/name.key``."""
        cert, key = folder / f"{name}.crt", folder / f"{name}.key"
        cert.write_bytes(self.certificate)
        key.write_bytes(self.key)
        return cert, key


class Authority:
    """A CA valid for a day, which signs leaf certificates."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._certificate = self._builder(_name(name), self._key.public_key()).add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True).add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False), critical=True).sign(self._key, hashes.SHA256())
        self.pem = self._certificate.public_bytes(serialization.Encoding.PEM)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey,
                 ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(_name(self.name))
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def issue(self, name: str, *, client: bool = False) -> Pair:
        """A server certificate for the DNS name ``name`` (and 127.0.0.1), or with ``client``
        a client certificate whose subject is ``name``."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (self._builder(_name(name), key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       self._key.public_key()), critical=False))
        if not client:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return Pair(certificate.public_bytes(serialization.Encoding.PEM), _pem_key(key))
