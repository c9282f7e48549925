"""Where nv-hostengine listens: the ``--dcgm-hostengine`` text parsed into a TCP or unix socket address."""

from __future__ import annotations

from dataclasses import dataclass

from smlens.errors import ConfigError

HOSTENGINE_PORT = 5555  # nv-hostengine's own default, so a stock install needs no flag
DEFAULT_HOSTENGINE = f"localhost:{HOSTENGINE_PORT}"


@dataclass(frozen=True)
class HostengineAddress:
    """Where nv-hostengine listens: ``host:port`` over TCP, or a unix socket path."""

    target: str
    unix_socket: bool = False

    def __str__(self) -> str:
        return f"unix://{self.target}" if self.unix_socket else self.target


def parse_hostengine(text: str | None) -> HostengineAddress:
    """``HOST[:PORT]`` (IPv6 in brackets), ``unix:///path`` or ``/path``; None means localhost:5555."""
    if text is None:
        return HostengineAddress(DEFAULT_HOSTENGINE)
    text = text.strip()
    if text.startswith("unix://") or text.startswith("/"):
        path = text.removeprefix("unix://")
        if not path.startswith("/"):
            raise ConfigError(
                f"DCGM hostengine socket {text!r} must be an absolute path such as unix:///run/dcgm.sock."
            )
        return HostengineAddress(path, unix_socket=True)
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        host, port = text, str(HOSTENGINE_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"DCGM hostengine {text!r} is not HOST:PORT (e.g. localhost:5555) or a unix socket path."
        )
    return HostengineAddress(f"{host}:{int(port)}")
