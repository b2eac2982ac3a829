"""The nbcluster Jupyter server extension: entry points only (routes live in `handlers`).

Installing the package enables it through
``etc/jupyter/jupyter_server_config.d/nbcluster.json``; by hand:
``jupyter server extension enable nbcluster.server``.
"""

from __future__ import annotations

import json
from typing import Any

from nbcluster import config
from nbcluster.server.handlers import setup_handlers


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbcluster.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    setup_handlers(server_app.web_app)
    # The sidebar's settings (Dask config) reach the browser in JupyterLab's and Notebook 7's
    # page config, so the TypeScript keeps no defaults of its own.
    page_config = server_app.web_app.settings.setdefault("page_config_data", {})
    page_config["nbclusterSidebar"] = json.dumps(config.sidebar_settings())
    server_app.log.info("nbcluster: routes registered under %snbcluster/", server_app.base_url)
