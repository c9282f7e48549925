"""The web configuration file: exporter-toolkit's format, one sentence naming the key for every refusal."""

from __future__ import annotations

import ssl
from pathlib import Path

import bcrypt
import h11
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smlens.errors import ConfigError
from smlens.web.webconfig import PLAIN, load_web_config, web_config_from
from smlens.web.webconfig_file import go_duration
from tls_support import TestCA

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA(directory)
    ca.issue("server", ["localhost", "127.0.0.1"])
    return ca, directory


def write(directory: Path, content: object) -> Path:
    path = directory / "web.yml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_node_exporter_file_with_relative_paths_loads(pki: tuple[TestCA, Path]) -> None:
    ca, directory = pki
    config = load_web_config(
        write(
            directory,
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": ca.path.name,
                    "min_version": "TLS12",
                    "max_version": "TLS13",
                    "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
                    "curve_preferences": ["CurveP256"],
                    "client_allowed_sans": ["prometheus"],
                },
                "http_server_config": {"http2": True, "headers": {"X-Frame-Options": "deny"}},
                "basic_auth_users": {"prometheus": HASH},
                "rate_limit": {"interval": "100ms", "burst": 5},
            },
        )
    )
    assert config.tls is not None
    assert config.tls.verify_mode == ssl.CERT_REQUIRED
    assert config.tls.minimum_version == ssl.TLSVersion.TLSv1_2
    assert config.users == {"prometheus": HASH.encode()}
    assert config.headers == ((b"x-frame-options", b"deny"),)
    assert config.rate_per_second == pytest.approx(10.0)
    assert config.allowed_sans == frozenset({"prometheus"})
    assert directory / "server.crt" in config.watched


def test_empty_file_means_plain_http(tmp_path: Path) -> None:
    config = load_web_config(write(tmp_path, ""))
    assert (config.tls, dict(config.users), config.rate_per_second) == (None, {}, 0.0)
    assert PLAIN.tls is None


def test_inline_cert_and_key_load(pki: tuple[TestCA, Path], tmp_path: Path) -> None:
    _, directory = pki
    tls = {"cert": (directory / "server.crt").read_text(), "key": (directory / "server.key").read_text()}
    assert load_web_config(write(tmp_path, {"tls_server_config": tls})).tls is not None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"basic_auth_users": {"alice": "secret"}}, "basic_auth_users: the password of user 'alice' is not"),
        ({"basic_auth_users": {"b": HASH + "\n"}}, "the password of user 'b' is not a bcrypt hash"),
        ({"basic_auth_users": {"c": "$2b$99$" + HASH[7:]}}, "the password of user 'c' is not a bcrypt hash"),
        ({"basic_auth_users": {"d": "$2b$03$" + HASH[7:]}}, "the password of user 'd' is not a bcrypt hash"),
        ({"basic_auth_user": {}}, "unknown key 'basic_auth_user'"),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_allowed_sans": ["p"],
                }
            },
            "tls_server_config.client_allowed_sans needs client certificates",
        ),
        ({"tls_server_config": {"cert_file": "server.crt"}}, "missing one of key or key_file"),
        ({"tls_server_config": {"key_file": "server.key"}}, "missing one of cert or cert_file"),
        (
            {"tls_server_config": {"cert_file": "absent.crt", "key_file": "server.key"}},
            "tls_server_config.cert_file: cannot read /",  # the resolved path
        ),
        (
            {"tls_server_config": {"cert_file": "server.crt", "key_file": "absent.key"}},
            "pki0/absent.key: No such file or directory.",
        ),
        (
            {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.crt"}},
            "do not load as a PEM pair",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "min_version": "TLS14",
                }
            },
            "tls_server_config.min_version: 'TLS14' is not one of",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "min_version": "TLS13",
                    "max_version": "TLS12",
                }
            },
            "min_version TLS13 is above max_version TLS12",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAnyClientCert",
                    "client_ca_file": "server.crt",
                }
            },
            "client_auth_type RequireAnyClientCert",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                }
            },
            "needs client_ca_file or client_ca",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_ca_file": "x",
                }
            },
            "client CAs are configured but client_auth_type is NoClientCert",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
                }
            },
            "tls_server_config.cipher_suites: 'TLS_AES_128_GCM_SHA256' is not a TLS 1.2 suite",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "curve_preferences": ["X25519", "CurveP256"],
                }
            },
            "tls_server_config.curve_preferences: Python's ssl module can restrict",
        ),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "HTTP header 'Server' can not be configured"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "X-Frame-Options must be one of"),
        ({"rate_limit": {"interval": "soon"}}, "rate_limit.interval: 'soon' is not a duration"),
        ({"basic_auth_users": {"a\nb": 1}}, "basic_auth_users.'a\\nb': Input should be a valid string"),
        ("[1, 2]", "must be a mapping"),
        ("a: [", "is not valid YAML"),
    ],
)
def test_bad_files_get_one_sentence_naming_the_key(
    pki: tuple[TestCA, Path], content: object, expected: str
) -> None:
    _, directory = pki
    with pytest.raises(ConfigError) as caught:
        load_web_config(write(directory, content))
    message = str(caught.value)
    assert expected in message, message
    assert "\n" not in message and message.endswith(".")


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read web config file"):
        load_web_config(tmp_path / "absent.yml")
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_web_config(binary)


def test_go_durations() -> None:
    assert go_duration("1m30s") == 90.0
    assert go_duration("250ms") == 0.25
    assert go_duration("0") == 0.0
    assert go_duration(".5s") == 0.5 and go_duration("1.s") == 1.0  # as Go's time.ParseDuration
    with pytest.raises(ValueError):
        go_duration(".s")
    with pytest.raises(ValueError):
        go_duration("1x")


_KEYS = st.sampled_from(
    [
        "tls_server_config",
        "http_server_config",
        "basic_auth_users",
        "rate_limit",
        "cert_file",
        "key_file",
        "client_auth_type",
        "min_version",
        "cipher_suites",
        "headers",
        "interval",
        "burst",
        "X-Frame-Options",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["TLS12", "TLS99", "server.crt", "deny", "1s", "$2y$10$x", "RequireAndVerifyClientCert"]),
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.one_of(_KEYS, st.text(max_size=8)), children, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=_DOCUMENTS)
def test_any_document_gives_a_config_or_one_sentence(pki: tuple[TestCA, Path], document: object) -> None:
    _, directory = pki
    try:
        web_config_from(document, directory / "web.yml")
    except ConfigError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.text(max_size=200).map(str.encode), st.binary(max_size=200)))
def test_any_file_gives_a_config_or_one_sentence(pki: tuple[TestCA, Path], data: bytes) -> None:
    _, directory = pki
    path = directory / "fuzzed.yml"
    path.write_bytes(data)
    try:
        load_web_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(
    "value", ["default-src \u2192", "a\r\nSet-Cookie: x=1", "a\nb", "a\x00b", "a\x01b", " a"]
)
def test_header_values_that_are_not_valid_http_are_refused(pki: tuple[TestCA, Path], value: str) -> None:
    _, directory = pki
    with pytest.raises(ConfigError) as caught:
        web_config_from(
            {"http_server_config": {"headers": {"Content-Security-Policy": value}}}, directory / "w.yml"
        )
    message = str(caught.value)
    assert "http_server_config.headers: Content-Security-Policy:" in message and "\n" not in message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(max_size=30))
def test_every_accepted_header_value_is_one_h11_sends(pki: tuple[TestCA, Path], value: str) -> None:
    _, directory = pki
    document = {"http_server_config": {"headers": {"Content-Security-Policy": value}}}
    try:
        config = web_config_from(document, directory / "w.yml")
    except ConfigError:
        return
    # h11 is the library that writes the response: it raises LocalProtocolError on a bad field.
    h11.Response(status_code=200, headers=list(config.headers))


def test_empty_client_allowed_sans_means_no_check_as_in_exporter_toolkit(pki: tuple[TestCA, Path]) -> None:
    ca, directory = pki
    tls = {
        "cert_file": "server.crt",
        "key_file": "server.key",
        "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": ca.path.name,
        "client_allowed_sans": [],
    }
    assert web_config_from({"tls_server_config": tls}, directory / "web.yml").allowed_sans is None
