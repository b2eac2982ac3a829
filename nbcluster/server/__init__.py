"""The nbcluster Jupyter server extension: entry points only (routes live in `handlers`).

Installing the package enables it through
``etc/jupyter/jupyter_server_config.d/nbcluster.json``; by hand:
``jupyter server extension enable nbcluster.server``.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbcluster.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from nbcluster.server.handlers import setup_handlers

    setup_handlers(server_app.web_app)
    server_app.log.info("nbcluster: routes registered under %snbcluster/", server_app.base_url)
