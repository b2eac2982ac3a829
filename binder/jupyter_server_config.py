# Copied to ~/.jupyter by binder/postBuild: open JupyterLab on the five-minute notebook.
# (A Binder link with `?urlpath=...` still wins; see notebooks/README.md.)
c = get_config()  # noqa: F821
c.ServerApp.default_url = "/lab/tree/notebooks/00-getting-started.ipynb"
