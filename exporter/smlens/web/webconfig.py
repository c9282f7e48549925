"""The web configuration file, in the format of Prometheus' exporter-toolkit (docs/web-configuration.md
of prometheus/exporter-toolkit), so that a file written for node_exporter works unchanged.

Parsing gives a :class:`WebConfig` or a :class:`~smlens.errors.ConfigError` of one sentence that names
the offending key. Python's ``ssl`` module cannot do everything Go's ``crypto/tls`` does; what it cannot
honour is refused by name rather than silently weakened.
"""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smlens.errors import ConfigError
from smlens.files import read_yaml

if TYPE_CHECKING:
    from smlens.web.webconfig_file import TlsServerConfig

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names (crypto/tls CipherSuites()) of the TLS 1.0-1.2 suites, as OpenSSL names them. Like Go,
# cipher_suites never touches TLS 1.3, whose suites are not configurable.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}


@dataclass(frozen=True)
class WebConfig:
    """A checked web configuration; ``tls`` is None when TLS is off."""

    path: Path | None
    users: Mapping[str, bytes]
    headers: tuple[tuple[bytes, bytes], ...]  # encoded once, as sent
    rate_per_second: float  # 0: no rate limit
    burst: int
    tls: ssl.SSLContext | None
    allowed_sans: frozenset[str] | None
    watched: tuple[Path, ...]  # files whose change means "read me again"


PLAIN = WebConfig(None, {}, (), 0.0, 0, None, None, ())


def _resolve(base: Path, name: str | None) -> Path | None:
    if name is None:
        return None
    path = Path(name)
    return path if path.is_absolute() else base / path


def _pem_file(text: str) -> Path:
    """ssl loads certificates and keys from files only: inline PEM goes to a private temporary file."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)  # noqa: SIM115
    with handle:
        handle.write(text)
    return Path(handle.name)


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKey


def _tls_context(tls: TlsServerConfig, base: Path) -> ssl.SSLContext:
    where = "tls_server_config"
    cert_file, key_file = _resolve(base, tls.cert_file), _resolve(base, tls.key_file)
    if cert_file is None and tls.cert is None:
        raise ConfigError(f"{where}: missing one of cert or cert_file.")
    if key_file is None and tls.key is None:
        raise ConfigError(f"{where}: missing one of key or key_file.")
    if cert_file is not None and tls.cert is not None:
        raise ConfigError(f"{where}: give cert or cert_file, not both.")
    if key_file is not None and tls.key is not None:
        raise ConfigError(f"{where}: give key or key_file, not both.")
    if tls.client_auth_type in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert"):
        raise ConfigError(
            f"{where}.client_auth_type {tls.client_auth_type} (a client certificate accepted without "
            "verification) cannot be honoured by Python's ssl module; use RequireAndVerifyClientCert "
            "or VerifyClientCertIfGiven with client_ca_file."
        )
    has_ca = tls.client_ca_file is not None or tls.client_ca is not None
    if has_ca and tls.client_auth_type == "NoClientCert":
        raise ConfigError(f"{where}: client CAs are configured but client_auth_type is NoClientCert.")
    if tls.client_allowed_sans and not has_ca:  # else every connection would be closed
        raise ConfigError(
            f"{where}.client_allowed_sans needs client certificates: set client_auth_type and client_ca_file."
        )
    if tls.client_auth_type != "NoClientCert" and not has_ca:
        raise ConfigError(
            f"{where}.client_auth_type {tls.client_auth_type} needs client_ca_file or client_ca."
        )
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        raise ConfigError(f"{where}: min_version {tls.min_version} is above max_version {tls.max_version}.")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.min_version/max_version cannot be honoured here: {exc}.") from None
    if tls.min_version in ("TLS10", "TLS11"):
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 refuses TLS < 1.2 at its default level
    temporary: list[Path] = []
    try:
        cert = cert_file or _pem_file(tls.cert or "")
        key = key_file or _pem_file(tls.key or "")
        temporary += [p for p, inline in ((cert, cert_file is None), (key, key_file is None)) if inline]
        try:
            # A callback, so that an encrypted key never makes OpenSSL prompt on the terminal (which would
            # hang start-up, or the event loop on a reload); exporter-toolkit takes no encrypted keys either.
            context.load_cert_chain(cert, key, password=_no_passphrase)
        except _EncryptedKey:
            raise ConfigError(
                f"{where}: the key is encrypted with a passphrase; give an unencrypted key "
                "(e.g. openssl pkey -in KEY -out KEY.plain)."
            ) from None
        except FileNotFoundError as exc:
            # ssl leaves exc.filename unset: name the file that is missing.
            name, missing = ("cert_file", cert) if not Path(cert).exists() else ("key_file", key)
            raise ConfigError(f"{where}.{name}: cannot read {missing}: {exc.strerror}.") from None
        except OSError as exc:
            raise ConfigError(
                f"{where}: the certificate and key do not load as a PEM pair ({_ssl_reason(exc)})."
            ) from None
    finally:
        for path in temporary:
            path.unlink(missing_ok=True)
    if has_ca:
        ca_file = _resolve(base, tls.client_ca_file)
        key_name = "client_ca_file" if ca_file is not None else "client_ca"
        try:
            if ca_file is not None:
                context.load_verify_locations(cafile=ca_file)
            else:
                context.load_verify_locations(cadata=tls.client_ca)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{where}.{key_name}: no CA certificate loads from it ({_ssl_reason(exc)})."
            ) from None
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
    if tls.cipher_suites:
        unknown = [name for name in tls.cipher_suites if name not in CIPHERS]
        if unknown:
            raise ConfigError(
                f"{where}.cipher_suites: {unknown[0]!r} is not a TLS 1.2 suite Python's ssl can use "
                f"(known: {', '.join(sorted(CIPHERS))})."
            )
        try:
            context.set_ciphers(":".join(CIPHERS[name] for name in tls.cipher_suites))
        except ssl.SSLError:
            raise ConfigError(f"{where}.cipher_suites: OpenSSL here offers none of them.") from None
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        unknown = [name for name in tls.curve_preferences if name not in CURVES]
        if unknown:
            raise ConfigError(
                f"{where}.curve_preferences: unknown curve {unknown[0]!r} (known: {', '.join(CURVES)})."
            )
        if len(tls.curve_preferences) > 1:
            raise ConfigError(
                f"{where}.curve_preferences: Python's ssl module can restrict the handshake to one curve "
                "only; list exactly one."
            )
        context.set_ecdh_curve(CURVES[tls.curve_preferences[0]])
    return context


def _ssl_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return str(reason).lower().replace("_", " ")


def web_config_from(raw: Any, path: Path) -> WebConfig:
    """Checks the parsed content of the web configuration file at ``path`` (relative file names in it
    are taken from its directory, as exporter-toolkit does)."""
    prefix = f"web config file {path}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix} must be a mapping of keys to values.")
    from smlens.web.webconfig_file import checked

    model = checked(raw, prefix)
    base = path.parent
    tls = model.tls_server_config
    try:
        context = _tls_context(tls, base) if tls.enabled else None
    except ConfigError as exc:
        raise ConfigError(f"{prefix}: {exc}") from None
    limit = model.rate_limit
    seconds = limit.seconds
    watched = tuple(
        p
        for p in (path, *(_resolve(base, n) for n in (tls.cert_file, tls.key_file, tls.client_ca_file)))
        if p is not None
    )
    return WebConfig(
        path=path,
        users={user: hashed.encode() for user, hashed in model.basic_auth_users.items()},
        headers=tuple(
            (name.lower().encode(), value.encode("latin-1"))
            for name, value in model.http_server_config.headers.items()
        ),
        rate_per_second=1.0 / seconds if seconds > 0 else 0.0,
        burst=limit.burst,
        tls=context,
        # exporter-toolkit checks the SANs only when the list is not empty.
        allowed_sans=frozenset(tls.client_allowed_sans) if tls.client_allowed_sans else None,
        watched=watched,
    )


def load_web_config(path: Path) -> WebConfig:
    return web_config_from(read_yaml(path, "web config file"), path)


def check_password(hashed: bytes, password: bytes) -> bool:
    import bcrypt  # only here: a node without basic_auth_users never loads it

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a malformed hash; refused at load, so only a dummy could get here
        return False
