"""The HTTP server in front of the application: exporter-toolkit's web configuration (TLS, basic auth,
headers), bounded connections, reload on SIGHUP and a prompt shutdown on SIGTERM."""

from __future__ import annotations

from smlens.config import ServeSettings
from smlens.serving.connections import Limits
from smlens.serving.server import WebServer, bind
from smlens.serving.webconfig import PLAIN, load_web_config


def open_server(settings: ServeSettings) -> WebServer:
    """Reads the web config and binds the port, so that either refusal comes before anything starts."""
    web_config = load_web_config(settings.web_config_file) if settings.web_config_file else PLAIN
    limits = Limits(
        header_timeout=settings.web_header_timeout,
        idle_timeout=settings.web_idle_timeout,
        max_connections=settings.web_max_connections,
    )
    return WebServer(bind(*settings.listen), limits, web_config, protect_probes=settings.web_protect_probes)
