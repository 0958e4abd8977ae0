"""Certificates for a throwaway cluster: one CA, serving and client certificates, service-account keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, cn)] + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    )


class CertificateAuthority:
    """A CA that lives in ``directory`` as ``<name>.crt``/``<name>.key`` and signs what the cluster needs."""

    def __init__(self, directory: Path, name: str = "ca", common_name: str = "atom-test-ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.pair.key)

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        orgs: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, orgs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair the API server signs service-account tokens with (``cert`` holds the public key)."""
    key = _key()
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pair
