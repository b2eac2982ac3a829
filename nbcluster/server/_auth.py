"""Who may use nbcluster's routes: Jupyter's authorizer, asked about one resource.

Every route (REST, the sidebar's stream, the dashboard proxy) is authorized on the
`RESOURCE` resource, "read" to look and "write" to change, as Jupyter's own routes are on
"kernels" or "contents": a server with a custom authorizer (JupyterHub's scopes) grants
nbcluster as a whole.
"""

from __future__ import annotations

from jupyter_core.utils import ensure_async
from jupyter_server.base.handlers import JupyterHandler

#: The resource every nbcluster route is authorized on.
RESOURCE = "nbcluster"


async def may_read(handler: JupyterHandler) -> bool:
    """Whether the handler's current user may read nbcluster (its clusters, their dashboards).

    Parameters
    ----------
    handler : jupyter_server.base.handlers.JupyterHandler
        The request's handler, authenticated.

    Returns
    -------
    bool
        The server's authorizer's answer for ``read`` on `RESOURCE`.
    """
    return bool(
        await ensure_async(handler.authorizer.is_authorized(handler, handler.current_user, "read", RESOURCE))
    )
