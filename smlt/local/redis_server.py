"""A throwaway `redis-server` on a free loopback port, for tests, benchmarks and local runs
(`LocalRedisServer`; with `tls=True` TLS only, with a throwaway CA and server certificate from
`make_test_certificates`, its `url` naming the CA). `scripts/redis.sh install` puts the binary
in place. Local-only: not in the Lambda layer."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from urllib.parse import quote

import redis


def redis_server_binary() -> str | None:
    """Path of redis-server (PATH, then the Debian location), or None."""
    return shutil.which("redis-server") or next(
        (
            p
            for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")
            if os.access(p, os.X_OK)
        ),
        None,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_test_certificates(
    directory: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 2
) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate it signs for `hosts` (IP addresses and names), as
    PEM files in `directory`: returns (ca.pem, server.pem, server.key). For tests only: the keys
    are unencrypted. Needs the `cryptography` package (moto's dependency, so always installed
    with smlt)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "smlt throwaway test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (
        os.path.join(directory, "ca.pem"),
        os.path.join(directory, "server.pem"),
        os.path.join(directory, "server.key"),
    )
    for path, data in zip(
        paths,
        (
            ca.public_bytes(serialization.Encoding.PEM),
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        ),
    ):
        with open(path, "wb") as f:
            f.write(data)
    os.chmod(paths[2], 0o600)
    return paths


class LocalRedisServer:
    """A throwaway redis-server on 127.0.0.1 (no persistence, no protected mode): a context manager.

    >>> with LocalRedisServer() as srv:
    ...     store = RedisStore(srv.url)

    `tls=True`: TLS only (`--port 0 --tls-port`), with a throwaway CA and server certificate for
    127.0.0.1 and localhost in the server's temporary directory (`ca_file`); clients are not asked
    for certificates. `url` is then `rediss://127.0.0.1:PORT/0?ssl_ca_certs=<ca_file>`.
    """

    def __init__(self, port: int | None = None, binary: str | None = None, maxmemory: str = "0", tls: bool = False):
        found = binary or redis_server_binary()
        if found is None:
            raise FileNotFoundError("redis-server is not installed (run `scripts/redis.sh install`)")
        self.binary = found
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.tls = tls
        self.ca_file: str | None = None
        self.proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        if self.tls:
            if self.ca_file is None:
                raise RuntimeError("the TLS server's URL names its CA, which exists once started")
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={quote(self.ca_file, safe='/')}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedisServer:
        self._dir = tempfile.TemporaryDirectory(prefix="smlt-redis-")
        if self.tls:
            self.ca_file, cert, key = make_test_certificates(self._dir.name)
            listen = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                cert,
                "--tls-key-file",
                key,
                "--tls-ca-cert-file",
                self.ca_file,
                "--tls-auth-clients",
                "no",
            ]
        else:
            listen = ["--port", str(self.port)]
        args = [
            self.binary,
            *listen,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            self._dir.name,
            "--maxmemory",
            self.maxmemory,
            "--proto-max-bulk-len",
            "1gb",
            "--client-output-buffer-limit",
            "normal 0 0 0",
            "--loglevel",
            "warning",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        last: Exception | None = None
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.ConnectionError as e:
                last = e
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"redis-server exited with {code}: {err.strip()[:500]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"redis-server did not answer on port {self.port} within {timeout} s"
                    + (f" (last error: {last})" if last else "")
                )
            time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> LocalRedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
