"""A cluster's TLS credentials: made, written 0600 beside its entry, and read back.

Every cluster gets its own self-signed certificate (`write_credentials`), which is also its
CA: the scheduler, the workers and every client present it, so only holders of the files can
connect. A gateway brings credentials of its own, held in memory, which `write_pem_credentials`
writes beside the entry the same way, so every front end connects to every cluster alike.
A registry entry's ``tls`` (`nbcluster._wire.Credentials`) names the three files.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from distributed import Security

from nbcluster._wire import Credentials
from nbcluster.cluster.registry import write_private


def write_credentials(directory: Path, name: str) -> tuple[Security, Credentials]:
    """A fresh self-signed certificate for this cluster, in 0600 files; the scheduler,
    the workers and every client present it, so only holders of the files can connect.

    An EC P-256 key, not Dask's RSA-2048 `Security.temporary()`: generating that costs
    about 0.6 s here, a third of a cluster's start-up.

    Parameters
    ----------
    directory : Path
        The registry folder (the files go beside the cluster's entry).
    name : str
        The cluster's name.

    Returns
    -------
    tuple of (distributed.Security, Credentials)
        The security to start the cluster with, and the files' paths for its entry.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nbcluster-{name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("dask-internal")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.cert.pem", directory / f"{name}.key.pem"
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    write_private(key_path, key_pem)
    tls: Credentials = {"ca_file": str(cert_path), "cert": str(cert_path), "key": str(key_path)}
    return security_from(tls), tls


def load_cryptography() -> None:
    """Import the `cryptography` modules `write_credentials` uses (about 30 ms).

    Kept out of this module's imports: a kernel imports it and never makes a certificate. A
    supervisor imports them while it waits for its request (`supervisor.import_ahead`).
    """
    import cryptography.hazmat.primitives.asymmetric.ec
    import cryptography.hazmat.primitives.hashes
    import cryptography.hazmat.primitives.serialization
    import cryptography.x509.oid  # noqa: F401


def security_from(tls: Credentials) -> Security:
    """The `distributed.Security` of a cluster's credential files (every role uses them).

    Parameters
    ----------
    tls : Credentials
        ``ca_file``, ``cert`` and ``key`` paths.

    Returns
    -------
    distributed.Security
        With encryption required.
    """
    return Security(
        require_encryption=True,
        tls_ca_file=tls["ca_file"],
        tls_client_cert=tls["cert"],
        tls_client_key=tls["key"],
        tls_scheduler_cert=tls["cert"],
        tls_scheduler_key=tls["key"],
        tls_worker_cert=tls["cert"],
        tls_worker_key=tls["key"],
    )


def tls_config(tls: Credentials) -> dict[str, Any]:
    """Dask config that makes every process reading it use these credentials for TLS.

    Parameters
    ----------
    tls : Credentials
        ``ca_file``, ``cert`` and ``key`` paths.

    Returns
    -------
    dict
        Flat ``distributed.comm.*`` keys (for `dask.config.set` or a worker's environment).
    """
    return {
        "distributed.comm.require-encryption": True,
        "distributed.comm.tls.ca-file": tls["ca_file"],
        **{f"distributed.comm.tls.{role}.cert": tls["cert"] for role in _ROLES},
        **{f"distributed.comm.tls.{role}.key": tls["key"] for role in _ROLES},
    }


_ROLES = ("scheduler", "worker", "client")


def write_pem_credentials(directory: Path, name: str, security: Any) -> Credentials:
    """A gateway's in-memory credentials (its `GatewaySecurity`: a self-signed certificate,
    which is also the CA) as 0600 files beside the entry, so every front end connects to its
    scheduler the way it does to ours.

    Parameters
    ----------
    directory : Path
        The registry folder.
    name : str
        The cluster's name.
    security : GatewaySecurity
        Its ``tls_cert`` and ``tls_key`` (PEM strings).

    Returns
    -------
    Credentials
        The files' paths.
    """
    paths = {part: directory / f"{name}.scheduler-{part}.pem" for part in ("ca", "cert", "key")}
    pems = {"ca": security.tls_cert, "cert": security.tls_cert, "key": security.tls_key}
    for part, path in paths.items():
        write_private(path, pems[part])
    return {"ca_file": str(paths["ca"]), "cert": str(paths["cert"]), "key": str(paths["key"])}
