"""Throwaway PKI for the local control plane: a CA, the API server's serving cert, client certs, SA keys.

Everything is generated on the fly for each cluster directory; nothing here is a secret worth keeping.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    controller_manager_cert: Path
    controller_manager_key: Path
    sa_private_key: Path
    sa_public_key: Path
    # The process-kubelet's API (container logs): its serving certificate, and the client
    # certificate kube-apiserver presents to it.
    kubelet_cert: Path
    kubelet_key: Path
    apiserver_kubelet_client_cert: Path
    apiserver_kubelet_client_key: Path
    # The fault proxy's serving certificate (testbed/faults/proxy.py): 127.0.0.1 and localhost, signed by
    # the cluster CA, so a pod's kubeconfig pointed at the proxy verifies it with the CA it has.
    proxy_cert: Path
    proxy_key: Path
    # The serving certificate of admission webhooks served on loopback (Kueue's): 127.0.0.1, signed
    # by the cluster CA, which the webhook configurations give the API server as their caBundle.
    webhook_cert: Path
    webhook_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    *,
    usage: ExtendedKeyUsageOID,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _subject(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def generate(directory: Path) -> Pki:
    """Create (or reuse, when already there) every key and certificate the cluster needs."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        controller_manager_cert=directory / "controller-manager.crt",
        controller_manager_key=directory / "controller-manager.key",
        sa_private_key=directory / "sa.key",
        sa_public_key=directory / "sa.pub",
        kubelet_cert=directory / "kubelet.crt",
        kubelet_key=directory / "kubelet.key",
        apiserver_kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        apiserver_kubelet_client_key=directory / "apiserver-kubelet-client.key",
        proxy_cert=directory / "api-proxy.crt",
        proxy_key=directory / "api-proxy.key",
        webhook_cert=directory / "webhook.crt",
        webhook_key=directory / "webhook.key",
    )
    if pki.sa_public_key.exists() and pki.webhook_key.exists():
        return pki

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _subject("shardops-local-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(pki.ca_cert, ca_cert)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    _write_key(pki.serving_key, serving_key)
    _write_cert(
        pki.serving_cert,
        _issue(
            ca_key,
            ca_name,
            _subject("kube-apiserver"),
            serving_key,
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            sans=sans,
        ),
    )

    kubelet_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.kubelet_key, kubelet_key)
    _write_cert(
        pki.kubelet_cert,
        _issue(
            ca_key,
            ca_name,
            _subject("system:node:local-node", "system:nodes"),
            kubelet_key,
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            # The Node's addresses: kube-apiserver dials its InternalIP.
            sans=[x509.DNSName("local-node"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ),
    )

    loopback = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for cert_path, key_path, subject in (
        (pki.proxy_cert, pki.proxy_key, _subject("shardops-api-fault-proxy")),
        (pki.webhook_cert, pki.webhook_key, _subject("shardops-loopback-webhooks")),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key_path, key)
        _write_cert(
            cert_path,
            _issue(ca_key, ca_name, subject, key, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=loopback),
        )

    for cert_path, key_path, subject in (
        (pki.admin_cert, pki.admin_key, _subject("shardops-admin", "system:masters")),
        (pki.controller_manager_cert, pki.controller_manager_key, _subject("system:kube-controller-manager")),
        (
            pki.apiserver_kubelet_client_cert,
            pki.apiserver_kubelet_client_key,
            _subject("kube-apiserver-kubelet-client", "system:masters"),
        ),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key_path, key)
        _write_cert(cert_path, _issue(ca_key, ca_name, subject, key, usage=ExtendedKeyUsageOID.CLIENT_AUTH))

    # Service-account tokens are signed with RSA: every Kubernetes version accepts RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
