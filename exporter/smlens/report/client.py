"""Prometheus' HTTP API, as ``smlens report`` reads it: auth and TLS as Prometheus' own clients take them
(a bearer token or basic auth, a CA file, a client certificate, a server name, skipping verification),
secrets read from files, every failure one sentence.

Queries go as POST forms (the owner query is long); each answer must be Prometheus' JSON envelope, or the
server is not taken for a Prometheus.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any

import httpx

from smlens.errors import ConfigError, SmlensError
from smlens.files import read_bounded
from smlens.settings import ReportSettings

MAX_SECRET_BYTES = 4096
_ERRNO = re.compile(r"^\[Errno -?\d+\]\s*")


class ReportError(SmlensError):
    """Prometheus cannot be read, or its answer is not one the report can use."""


class QueryError(ReportError):
    """Prometheus refused or failed a query; ``message`` is its own error."""

    def __init__(self, sentence: str, message: str) -> None:
        super().__init__(sentence)
        self.message = message


def read_secret(path: Path, what: str) -> str:
    """A token or password file's content less surrounding whitespace, as Prometheus reads such files."""
    data = read_bounded(path, what, limit=MAX_SECRET_BYTES)
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text.") from None
    if not text:
        raise ConfigError(f"{what} {path} is empty.")
    return text


def _tls_context(s: ReportSettings) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=str(s.ca_file) if s.ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot use --ca-file {s.ca_file}: {_reason(exc)}.") from None
    if s.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if s.cert_file is not None and s.key_file is not None:
        try:
            context.load_cert_chain(str(s.cert_file), str(s.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot use --cert-file {s.cert_file} with --key-file {s.key_file}: {_reason(exc)}."
            ) from None
    return context


def _reason(exc: BaseException) -> str:
    """The words of an OS or TLS error, without its errno or OpenSSL source position."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {str(exc.verify_message).rstrip('.')}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return _sentence_case(exc.strerror)
    text = _ERRNO.sub("", str(exc)).strip() or type(exc).__name__
    text = re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text)
    return _sentence_case(text)


def _sentence_case(text: str) -> str:
    """The words as the middle of a sentence writes them: "connection refused"; "TLS ..." stays."""
    return text[0].lower() + text[1:] if re.match(r"^[A-Z][a-z]", text) else text


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return current
        seen.add(id(current))
        for arg in current.args:
            if isinstance(arg, ssl.SSLError):
                return arg
        current = current.__cause__ or current.__context__
    return None


class Prometheus:
    """A client of one Prometheus' HTTP API."""

    def __init__(self, s: ReportSettings) -> None:
        assert s.prometheus is not None  # ReportSettings.check
        self.url = s.prometheus
        self.timeout = s.timeout
        self._credentials = s.bearer_token_file is not None or s.basic_auth_user is not None
        headers = {"User-Agent": "smlens-report", "Accept": "application/json"}
        auth: httpx.Auth | None = None
        if s.bearer_token_file is not None:
            headers["Authorization"] = "Bearer " + read_secret(s.bearer_token_file, "bearer token file")
        if s.basic_auth_user is not None and s.basic_auth_password_file is not None:
            password = read_secret(s.basic_auth_password_file, "basic auth password file")
            auth = httpx.BasicAuth(s.basic_auth_user, password)
        self._extensions = {"sni_hostname": s.server_name} if s.server_name else {}
        self._client = httpx.Client(
            verify=_tls_context(s),
            headers=headers,
            auth=auth,
            timeout=s.timeout,
            trust_env=False,  # no proxy or .netrc from the environment: the flags say all
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}"
        try:
            if method == "POST":
                response = self._client.post(url, data=params, extensions=self._extensions)
            else:
                response = self._client.get(url, params=params, extensions=self._extensions)
        except httpx.TimeoutException:
            raise ReportError(
                f"Prometheus at {self.url} did not answer within {self.timeout:g} s (--timeout)."
            ) from None
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        return self._answer(path, response)

    def _transport_error(self, exc: httpx.HTTPError) -> ReportError:
        tls = _ssl_error(exc)
        if tls is not None:
            return ReportError(
                f"TLS with Prometheus at {self.url} failed ({_reason(tls)}): check --ca-file, --server-name, "
                "--cert-file and --key-file, or --insecure-skip-verify."
            )
        if isinstance(exc, httpx.ConnectError):
            return ReportError(f"cannot reach Prometheus at {self.url}: {_reason(exc)}.")
        return ReportError(f"the connection to Prometheus at {self.url} failed: {_reason(exc)}.")

    def _answer(self, path: str, response: httpx.Response) -> Any:
        status = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        if response.status_code in (401, 403):
            if not self._credentials:
                raise ReportError(
                    f"Prometheus at {self.url} asks for credentials ({status}): pass --bearer-token-file, "
                    "or --basic-auth-user with --basic-auth-password-file."
                )
            raise ReportError(
                f"Prometheus at {self.url} refused the credentials ({status}): check --bearer-token-file, "
                "or --basic-auth-user and --basic-auth-password-file."
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            raise ReportError(
                f"{self.url} does not answer as a Prometheus HTTP API: {path} gave {status} ({kind}), "
                "not Prometheus' JSON."
            )
        if body["status"] == "error":
            message = str(body.get("error", "")).strip() or str(body.get("errorType", "unknown error"))
            message = message.rstrip(".")
            if "too many samples" in message:  # each query reads at most an hour of the series
                raise QueryError(
                    f"Prometheus at {self.url} refused a query over an hour of the accounting series as too "
                    f"large ({message}): raise its --query.max-samples.",
                    message,
                )
            raise QueryError(f"Prometheus at {self.url} failed a request ({status}): {message}.", message)
        return body.get("data")

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query at unix time ``at``: its vector, or for a range selector its matrix."""
        data = self._request("POST", "/api/v1/query", {"query": expr, "time": _stamp(at)})
        return self._result(data, ("vector", "matrix"))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix: ``expr`` at start, start + step, ... up to end."""
        params = {"query": expr, "start": _stamp(start), "end": _stamp(end), "step": _stamp(step)}
        data = self._request("POST", "/api/v1/query_range", params)
        return self._result(data, ("matrix",))

    def _result(self, data: Any, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or data.get("resultType") not in kinds:
            raise ReportError(f"{self.url} answered a query with something else than a Prometheus result.")
        result = data.get("result")
        if not isinstance(result, list):
            raise ReportError(f"{self.url} answered a query with something else than a Prometheus result.")
        return result

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """Values of ``label`` on the series ``match`` selects that have samples from start to end."""
        params = {"match[]": match, "start": _stamp(start), "end": _stamp(end)}
        data = self._request("GET", f"/api/v1/label/{label}/values", params)
        if not isinstance(data, list):
            raise ReportError(f"{self.url} answered a label query with something else than a list.")
        return [str(value) for value in data]

    def flags(self) -> dict[str, str]:
        """Prometheus' command-line flags; empty where the server does not give them (Thanos, Mimir...)."""
        try:
            data = self._request("GET", "/api/v1/status/flags", {})
        except ReportError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _stamp(seconds: float) -> str:
    """Seconds to the millisecond, as Prometheus stores time."""
    return f"{round(seconds * 1000) / 1000:.3f}"
