"""A TLS-terminating TCP relay for tests, and the certificates it and its clients use.

It stands for Temporal's frontend served over TLS. The dev server the tests run (`temporal server start-dev`)
cannot serve TLS, so the relay terminates TLS in front of its plaintext port, as a production frontend configured
with `global.tls.frontend` would (in the server image: TEMPORAL_TLS_SERVER_CERT and TEMPORAL_TLS_SERVER_KEY for its
identity, TEMPORAL_TLS_SERVER_CA_CERT / TEMPORAL_TLS_CLIENT1_CA_CERT for the CA its clients' certificates must chain
to, and TEMPORAL_TLS_REQUIRE_CLIENT_AUTH=true for `requireClientAuth: true`, i.e. mutual TLS). With `client_ca`
given, a client without a certificate signed by that CA fails its handshake, as it would against such a frontend.

gRPC over TLS needs the server to select ALPN `h2` (gRPC's C core refuses a peer that did not), so the relay offers
only `h2`; past the handshake it relays bytes unchanged, so HTTP/2 and gRPC pass through it untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()


@contextlib.asynccontextmanager
async def tls_relay(upstream: str, cert: Path, key: Path, client_ca: Path | None = None) -> AsyncIterator[str]:
    """Serve TLS on 127.0.0.1 (a free port) and relay each connection to the plaintext `upstream` host:port; yields
    the relay's `127.0.0.1:port`. With `client_ca`, a client certificate signed by it is required (mutual TLS).
    On exit every connection is cut and the listener closed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    context.set_alpn_protocols(["h2"])
    host, port = upstream.rsplit(":", 1)
    handlers: set[asyncio.Task[None]] = set()
    transports: set[asyncio.BaseTransport] = set()
    closing = False

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if closing:  # accepted just before the relay closed: its handler starts only now
            client_writer.transport.abort()
            return
        handlers.add(task)
        mine = [client_writer.transport]  # the plain TCP connection: cut on exit even mid-handshake
        transports.update(mine)
        try:
            await client_writer.start_tls(context)  # a client without an acceptable certificate fails here
            mine.append(client_writer.transport)
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            mine.append(upstream_writer.transport)
            transports.update(mine)
            directions = [
                asyncio.create_task(_pipe(client_reader, upstream_writer)),
                asyncio.create_task(_pipe(upstream_reader, client_writer)),
            ]
            try:
                # Either side ending (or failing) ends the connection: gRPC never half-closes a connection.
                await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for direction in directions:
                    direction.cancel()
                await asyncio.gather(*directions, return_exceptions=True)
        except OSError:
            pass  # a failed handshake (ssl.SSLError), or the upstream refused or reset: the connection is cut
        except asyncio.CancelledError:
            # Only the relay's exit cancels a handler. The handler ends normally: Python 3.11's stream server calls
            # `exception()` on its finished handler task, which raises (and logs an error) for a cancelled one.
            pass
        finally:
            for transport in mine:
                transport.abort()
                transports.discard(transport)
            handlers.discard(task)

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        closing = True
        server.close()
        for handler in list(handlers):
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        for transport in list(transports):
            transport.abort()
        await server.wait_closed()


@dataclass(frozen=True)
class Certificates:
    """PEM files: a CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, both by the CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certificates(directory: Path) -> Certificates:
    """Write a fresh CA and the server and client certificates it signs into `directory`; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Berth test CA"))
        .issuer_name(_name("Berth test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf(
        "localhost",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client_key, client_cert = leaf("berth-control-plane", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    paths = Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    paths.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_key.write_bytes(_key_pem(server_key))
    paths.client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    paths.client_key.write_bytes(_key_pem(client_key))
    return paths
