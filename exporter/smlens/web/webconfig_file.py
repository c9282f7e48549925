"""The schema of the web configuration file (exporter-toolkit's keys, checked by pydantic models), imported
only when smlens is given such a file: :mod:`smlens.web.webconfig` turns the checked file into a
:class:`~smlens.web.webconfig.WebConfig`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from smlens.errors import ConfigError
from smlens.files import quote

# The headers exporter-toolkit lets a file set, with the only values it accepts where it restricts them.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
_DURATION = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# RFC 9110 field-value: visible ASCII or obs-text, single spaces or tabs inside, nothing else (no CR/LF/NUL).
_FIELD_VALUE = re.compile(r"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?")
_BCRYPT = re.compile(rb"\$2[abxy]?\$(?:0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")  # bcrypt's costs: 4 to 31


def go_duration(text: str) -> float:
    """Seconds in a Go duration string such as ``1m30s`` or ``250ms`` (what exporter-toolkit reads)."""
    text = text.strip()
    if text == "0":
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{quote(text)} is not a duration such as 1s, 250ms or 1m30s")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TlsServerConfig(_Strict):
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: str | None = None
    client_allowed_sans: list[str] | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] | None = None
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] | None = None

    @property
    def enabled(self) -> bool:
        """exporter-toolkit's IsEnabled: any certificate, key, CA or client-auth setting turns TLS on."""
        return (
            any(
                value is not None
                for value in (
                    self.cert,
                    self.key,
                    self.client_ca,
                    self.cert_file,
                    self.key_file,
                    self.client_ca_file,
                )
            )
            or "client_auth_type" in self.model_fields_set
        )


class HttpServerConfig(_Strict):
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in HEADERS:
                raise ValueError(f"HTTP header {name!r} can not be configured")
            if HEADERS[name] and value not in HEADERS[name]:
                raise ValueError(f"{name} must be one of {', '.join(HEADERS[name])}, not {value!r}")
            if not _FIELD_VALUE.fullmatch(value):
                raise ValueError(
                    f"{name}: {value!r} is not a valid HTTP header value "
                    "(visible Latin-1 characters and inner spaces only, no line breaks)"
                )
        return headers


class RateLimit(_Strict):
    interval: str = "0"
    burst: int = Field(default=0, ge=0)

    @property
    def seconds(self) -> float:
        return go_duration(self.interval)

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ValueError("must be a duration such as 1s or 250ms")
        go_duration(raw)
        return raw


class WebConfigFile(_Strict):
    tls_server_config: TlsServerConfig = Field(default_factory=TlsServerConfig)
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    rate_limit: RateLimit = Field(default_factory=RateLimit)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_only(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if not _BCRYPT.fullmatch(hashed.encode()):  # no trailing newline (YAML's |) that never matches
                raise ValueError(
                    f"the password of user {user!r} is not a bcrypt hash (make one with "
                    '\'htpasswd -nBC 10 "" | tr -d ":\\n"\'); plaintext passwords are refused'
                )
        return users


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(part if isinstance(part, str) and part.isprintable() else repr(part) for part in loc)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = _location(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {where!r}"
    if error["type"] == "literal_error":
        allowed = error.get("ctx", {}).get("expected", "")
        return f"{where}: {quote(error['input'])} is not one of {allowed}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def checked(raw: dict[str, Any], prefix: str) -> WebConfigFile:
    """The file's content as the model, or one sentence that starts with ``prefix`` and names the key."""
    try:
        return WebConfigFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{prefix}: {_first_error(exc)}.") from None
