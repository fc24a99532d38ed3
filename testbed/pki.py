"""Throwaway certificate authorities and the cluster's PKI: kube-apiserver needs TLS, service
account keys and a token file before it starts, and mTLS tests need CAs of their own."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

APISERVER_SANS = (
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "10.0.0.1",  # first IP of controlplane.SERVICE_CLUSTER_IP_RANGE: the `kubernetes` Service
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _general_names(sans: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    return names


@dataclass(frozen=True)
class CertAuthority:
    """A throwaway CA that writes PEM files into ``directory``.

    Keys are ECDSA P-256: quick to generate and accepted by Go, OpenSSL and Python's ssl.
    """

    directory: Path
    cert_path: Path
    key_path: Path
    _cert: x509.Certificate = field(repr=False)
    _key: ec.EllipticCurvePrivateKey = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def create(
        cls, directory: Path, name: str = "schedext-test-ca", *, valid_days: int = 7
    ) -> CertAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))  # tolerate small clock skew
            .not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        stem = file_stem(name)
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private(key_path, _pem_key(key))
        return cls(directory, cert_path, key_path, cert, key)

    def issue_cert(
        self,
        common_name: str,
        *,
        sans: Sequence[str] = (),
        client: bool = False,
        server: bool = True,
        organizations: Sequence[str] = (),
        valid_days: int = 7,
    ) -> tuple[Path, Path]:
        """Issue a leaf certificate; return ``(cert_path, key_path)``.

        ``sans`` entries that parse as IP addresses become IP SANs, the rest DNS SANs.
        ``organizations`` become O= entries (Kubernetes reads them as groups for client certs).
        """
        if not (client or server):
            raise ValueError("a certificate must allow client and/or server auth")
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(_general_names(sans)), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self._unique_paths(file_stem(common_name))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private(key_path, _pem_key(key))
        return cert_path, key_path

    def _unique_paths(self, stem: str) -> tuple[Path, Path]:
        # Two certs for the same CN (e.g. server and client) must not overwrite each other.
        with self._lock:
            for i in range(1000):
                name = stem if i == 0 else f"{stem}-{i}"
                crt, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
                if not crt.exists():
                    crt.touch()
                    return crt, key
        raise RuntimeError(f"too many certificates named {stem!r} in {self.directory}")


def file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "cert"


@dataclass(frozen=True)
class ClusterPki:
    """Everything kube-apiserver needs for TLS, service accounts and a static admin token."""

    directory: Path
    ca: CertAuthority
    apiserver_cert: Path
    apiserver_key: Path
    sa_private_key: Path
    sa_public_key: Path
    token_file: Path
    admin_token: str = field(repr=False)

    @classmethod
    def generate(cls, directory: Path) -> ClusterPki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertAuthority.create(directory, "schedext-cluster-ca")
        apiserver_cert, apiserver_key = ca.issue_cert(
            "kube-apiserver", sans=APISERVER_SANS, server=True
        )
        # Service-account tokens are signed with RSA (RS256 is what every client expects).
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sa_private, sa_public = directory / "sa.key", directory / "sa.pub"
        write_private(sa_private, _pem_key(sa_key))
        sa_public.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # Static token file: token,user,uid,"group". system:masters bypasses RBAC, so the token
        # works even before the RBAC bootstrap roles exist.
        token = secrets.token_hex(16)
        token_file = directory / "tokens.csv"
        write_private(
            token_file, f'{token},schedext-admin,schedext-admin,"system:masters"\n'.encode()
        )
        return cls(
            directory, ca, apiserver_cert, apiserver_key, sa_private, sa_public, token_file, token
        )
