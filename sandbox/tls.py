"""Each sandbox GKE cluster's own CA and its API server's certificate, as GKE gives every cluster (FACTS §19).

The CA is self-signed and per cluster; the server certificate it signs names ``IP:127.0.0.1``, where the cluster's
Kubernetes API listens. The PEMs are kept with the cluster's state (its ``extra``), so a restarted sandbox serves the
same CA a client already trusts. The CA's private key is dropped once the server certificate is signed: nothing else
is ever signed with it.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOST = "127.0.0.1"
# GKE's cluster CAs last 30 years; the sandbox's need only outlive any test or demo.
VALID_DAYS = 3650


@dataclass(frozen=True)
class ClusterTls:
    """One cluster's CA certificate and its API server's certificate and key (PEM)."""

    ca_pem: str
    cert_pem: str
    key_pem: str

    @property
    def ca_base64(self) -> str:
        """The CA as ``masterAuth.clusterCaCertificate`` carries it: base64 of the PEM."""
        return base64.b64encode(self.ca_pem.encode()).decode()

    def to_json(self) -> dict[str, str]:
        """For the cluster's persisted state."""
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ClusterTls:
        """Back from the persisted state."""
        return cls(str(record["ca_pem"]), str(record["cert_pem"]), str(record["key_pem"]))

    def server_context(self) -> ssl.SSLContext:
        """The TLS context of the cluster's API server (TLS 1.2 or later, as GKE's)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a key pair only from files: a private directory, gone as soon as it is loaded.
        with tempfile.TemporaryDirectory(prefix="sandbox-tls-") as directory:
            chain = Path(directory) / "server.pem"
            fd = os.open(chain, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(self.key_pem + self.cert_pem)
            context.load_cert_chain(chain)
        return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def new_cluster_tls(cluster_name: str, now: datetime.datetime | None = None) -> ClusterTls:
    """A fresh CA for ``cluster_name`` and a server certificate for ``IP:127.0.0.1`` signed by it."""
    now = now or datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"sandbox cluster CA {cluster_name}"[:64])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return ClusterTls(_pem(ca), _pem(server), key_pem)
