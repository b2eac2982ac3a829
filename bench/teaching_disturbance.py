"""What the Jupyter server and the browser cost a timing: does the live view count as a disturbance?

A real JupyterLab (loopback, token) and headless Chromium run a notebook whose cell times a
400-item `%%distribute` run (items sleep, so the workers barely compute) four times, in turns,
with `nbcluster.teaching.timed`: counting as "ours" only the kernel and its descendants (how the
notebooks counted before), then also its ancestors and browsers (`teaching.ours`, now). The
difference is what the server relaying the live view and the browser drawing it used.

    PYTHONPATH=. python bench/teaching_disturbance.py
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import nbformat
from browser_helpers import launch_chromium
from playwright.sync_api import sync_playwright

CELLS = [
    "%load_ext nbcluster\n%cluster start --workers 2",
    "import psutil, time, json\nfrom nbcluster import teaching\n"
    "def old_ours():\n    me = psutil.Process()\n    return [me, *me.children(recursive=True)]\n"
    "",
    "import nbcluster\nres = {}\n"
    "def items():\n    get_ipython().run_cell_magic('distribute', '--over \"x in range(400)\" --batch 1 --into r', 'time.sleep(0.05)')\n"
    "items()\n"
    "for name, fn in [('old', old_ours), ('new', teaching.ours)] * 2:\n"
    "    t = teaching.timed(items, _ours=fn)\n    res.setdefault(name, []).append(round(t.others, 3))\n"
    "print('RESULT', json.dumps(res))",
    "%cluster stop",
]


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    root = tmp / "root"
    root.mkdir()
    token, port = secrets.token_hex(16), free_port()
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "s"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "w"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "r"),
        "NBCLUSTER_RUNTIME_DIR": str(tmp / "reg"),
    }
    log = open(tmp / "lab.log", "wb")  # noqa: SIM115 - the server writes it until the end
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            f"--ServerApp.port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while b"is running at" not in (tmp / "lab.log").read_bytes() and time.time() < deadline:
            time.sleep(0.5)
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, root / "m.ipynb")
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/lab/tree/m.ipynb?token={token}")
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel &&"
                " w.sessionContext.session.kernel.status === 'idle'; }",
                timeout=120_000,
            )
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            out = page.locator(".jp-OutputArea-output", has_text="RESULT {")
            out.first.wait_for(timeout=400_000)
            print(out.first.inner_text())
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
