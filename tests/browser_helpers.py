"""A real `jupyter lab` in a subprocess and a headless Chromium driving it.

`JupyterLab` starts the server on a free loopback port with a token and a non-default
base_url, in private config/data/runtime folders, with nbcluster's server extension and
the built labextension from this checkout (not whatever is installed in the environment),
and a private cluster registry. It waits for the server's own "is running at" line (an
event, not a sleep) and always stops the server, and the clusters it owns, on exit.

The labextension must be built first (`cd labextension && jlpm install && jlpm build:prod`,
or `pip install .`); a missing build fails the test with that instruction instead of
skipping it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

import psutil
import pytest

import nbcluster
from tests.os_helpers import free_port
from tests.waiting import until

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "nbcluster" / "labextension"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("NBCLUSTER_CHROMIUM", "/usr/bin/chromium")
START_TIMEOUT_S = 90


def labextension_dir() -> Path:
    """The built extension to serve: this checkout's build, else the installed copy."""
    if (BUILT / "package.json").exists():
        return BUILT
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "nbcluster"
    if (installed / "package.json").exists():
        return installed
    pytest.fail(
        "the nbcluster labextension is not built: run `cd labextension && jlpm install && "
        "jlpm build:prod` (or `pip install .`), then run the browser tests again"
    )


def terminate(proc: subprocess.Popen[str] | None, grace: float = 30) -> None:
    """SIGTERM a server, and SIGKILL its process group if it has not exited within `grace`
    seconds (the group catches anything it left behind)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def drain(stream: IO[str], log_path: Path, marker: str, ready: threading.Event) -> None:
    """Copy a server's output to `log_path` (shown when a test fails), setting `ready` at the
    line that contains `marker`, or at EOF. Reading to EOF keeps the pipe from filling up."""
    with open(log_path, "w") as log:
        for line in stream:
            log.write(line)
            log.flush()
            if marker in line:
                ready.set()
    ready.set()


class ServerLog:
    """A Jupyter server process: its output in `log_path` (`_ready` is set once it says it
    is running), and its shutdown with every cluster left in `runtime_dir`."""

    log_path: Path
    runtime_dir: Path
    proc: subprocess.Popen[str] | None
    _ready: threading.Event

    def _shut_down(self) -> None:
        # SIGTERM lets the server shut down its kernels; the clusters it owns follow it
        # (owner watch).
        terminate(self.proc)
        for handle in nbcluster.clusters(runtime_dir=self.runtime_dir):
            handle.stop()

    def _drain(self, stream: IO[str]) -> None:
        drain(stream, self.log_path, "is running at", self._ready)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class JupyterLab(ServerLog):
    """`with JupyterLab(tmp) as lab:` -> lab.url (with base_url), lab.token, lab.runtime_dir.

    `app="notebook"` starts Notebook 7 instead, which loads the same labextensions.
    """

    base_url = "/jl/"

    def __init__(self, tmp: Path, app: str = "jupyterlab"):
        self.app = app
        self.tmp = tmp
        self.root_dir = tmp / "notebooks"
        self.runtime_dir = tmp / "registry"
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}{self.base_url}"
        self.log_path = tmp / "jupyter-lab.log"
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def _prepare(self) -> dict[str, str]:
        data = self.tmp / "data"
        (data / "labextensions").mkdir(parents=True)
        (data / "labextensions" / "nbcluster").symlink_to(labextension_dir())
        config = self.tmp / "config"
        config.mkdir()
        (config / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}})
        )
        # No "get news?" toast over the page, no update checks (no internet in CI).
        settings = self.tmp / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        self.root_dir.mkdir()
        self.runtime_dir.mkdir()
        return {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(data),
            # JUPYTER_PATH comes first in Jupyter's search path, ahead of the environment's
            # share/jupyter, where `pip install -e .` leaves a snapshot copy that a rebuild
            # does not update: the build under test must shadow it, not the reverse.
            "JUPYTER_PATH": str(data),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(self.tmp / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.tmp / "workspaces"),
            "NBCLUSTER_RUNTIME_DIR": str(self.runtime_dir),
        }

    def __enter__(self) -> JupyterLab:
        env = self._prepare()
        cmd = [
            sys.executable, "-m", self.app, "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--ServerApp.base_url={self.base_url}",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
            # CI containers run as root; the server refuses root without this.
            "--allow-root",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        try:
            if not self._ready.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
                raise RuntimeError(f"{self.app} did not start; log:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._shut_down()
        ARTIFACTS.mkdir(exist_ok=True)
        kept = ARTIFACTS / f"{self.app}-server.log"
        kept.write_text(self.log())
        print(f"{self.app} server log: {kept}")


def launch_chromium(playwright: Any) -> Any:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (or set NBCLUSTER_CHROMIUM)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])


@contextlib.contextmanager
def watched_page(artifacts: Path) -> Iterator[Any]:
    """A 1280x900 page of a headless Chromium, closed afterwards; a failure meanwhile leaves
    ``failure.png`` in `artifacts` and prints the browser console's last 30 lines."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            try:
                yield page
            except Exception:
                page.screenshot(path=str(artifacts / "failure.png"))
                print("browser console:", *console[-30:], sep="\n  ")
                raise
        finally:
            browser.close()


def write_notebook(path: Path, *sources: str) -> None:
    """A notebook of code cells with `sources`, on the python3 kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def run_all_cells(page: Any, url: str) -> None:
    """Open the notebook at `url` and run all its cells, once its kernel is idle (not awaited)."""
    page.goto(url)
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session &&"
        " w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle'; }",
        timeout=90_000,
    )
    # Not awaited: the command's promise settles only when the cells have finished.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


class Screenshots:
    """Numbered screenshots under test-artifacts/<test>/, each path printed for CI logs.

    A folder is emptied the first time this process uses it, so it shows one run; several
    `Screenshots` (e.g. of a page and of its popup) share the folder's numbering.
    """

    _next: ClassVar[dict[Path, int]] = {}

    def __init__(self, page: Any, test_name: str):
        self.page = page
        self.folder = ARTIFACTS / test_name
        if self.folder not in Screenshots._next:
            shutil.rmtree(self.folder, ignore_errors=True)
            Screenshots._next[self.folder] = 1
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, label: str) -> Path:
        number = Screenshots._next[self.folder]
        Screenshots._next[self.folder] = number + 1
        path = self.folder / f"{number:02d}-{label}.png"
        self.page.screenshot(path=str(path))
        print(f"screenshot: {path}")
        return path


# WCAG's enhanced level (AAA), as the labels are small (--jp-ui-font-size0, 11px). The
# secondary grey the labels had (--jp-ui-font-color2) measured 6.0 on the dark theme's
# notebook background and 4.6 on the light one.
MIN_CONTRAST = 7.0

# WCAG contrast of every element that writes text, against what is painted behind it.
CONTRAST = """(root) => {
  const rgba = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return m.length === 3 ? [...m, 1] : m; };
  const over = (top, bottom) => top.slice(0, 3).map((c, i) => c * top[3] + bottom[i] * (1 - top[3]));
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] === 1) break;
    }
    return layers.reverse().reduce((acc, c) => over(c, acc), [255, 255, 255]);
  };
  const lum = (rgb) => { const [r, g, b] = rgb.map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  // Ancestors' opacity and filters change what is painted, not the computed colour.
  const dimming = (el) => {
    let opacity = 1;
    const filters = [];
    for (let e = el; e; e = e.parentElement) {
      const cs = getComputedStyle(e);
      opacity *= Number(cs.opacity);
      if (cs.filter !== "none") filters.push(cs.filter);
    }
    return { opacity, filters };
  };
  const out = [];
  for (const el of root.querySelectorAll("*")) {
    const own = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.data).join("").trim();
    if (!own || el.closest("svg")) continue;
    const bg = background(el);
    const { opacity, filters } = dimming(el);
    const color = rgba(getComputedStyle(el).color);
    const fg = over([...color.slice(0, 3), color[3] * opacity], bg);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    out.push({ text: own, ratio: (a + 0.05) / (b + 0.05), color: getComputedStyle(el).color,
      background: bg.map(Math.round).join(","), opacity, filters });
  }
  return out;
}"""


#: What `jupyter_app` gives JupyterLab (a module) beyond the common flags: nothing that would
#: look for updates or extensions on the network.
QUIET_APP_ARGS = {
    "jupyterlab": (
        "--LabApp.extension_manager=readonly",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
}


@contextlib.contextmanager
def jupyter_app(tmp_path: Path, module: str, app_class: str, root: Path) -> Iterator[tuple[str, str]]:
    """``python -m MODULE`` (JupyterLab or Notebook 7) serving `root` on loopback; yields its
    (base URL, token), and stops it and its kernels afterwards.

    Its settings, workspaces, runtime folder and log (``lab.log``) are in `tmp_path`, and it
    exposes its app to the page (`app_class`'s ``expose_app_in_browser``). It picks its own port
    (port 0) and reports it in its runtime-dir info file: on a shared machine a port found
    free beforehand can be taken before the server binds it.
    """
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    log_path = tmp_path / "lab.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", module, "--no-browser", "--allow-root",
                "--ServerApp.port=0", "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                f"--{app_class}.expose_app_in_browser=True",
                *QUIET_APP_ARGS.get(module, ()),
            ],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            yield wait_until_up(tmp_path / "runtime" / f"jpserver-{proc.pid}.json", token, proc, log_path), token
        finally:
            stop_server(proc)


def wait_until_up(
    info: Path, token: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90
) -> str:
    """The server's base URL, once its info file exists and its API answers."""
    # A starting server has no event to await from outside; look until it answers.
    def answering() -> str | None:
        base = str(json.loads(info.read_text())["url"]).rstrip("/")
        with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
            return base if r.status == 200 else None

    base = until(lambda: proc.poll() is not None or answering(), timeout, 0.25, ignore=(OSError, ValueError, KeyError))
    if proc.poll() is not None:
        raise AssertionError(f"the server exited early:\n{log.read_text()[-3000:]}")
    if isinstance(base, str):
        return base
    raise AssertionError(f"the server did not answer in {timeout} s:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """End a `jupyter` server started in a session of its own, and the kernels it spawned."""
    # Kernels run in sessions of their own: note them before the server goes.
    try:
        spawned = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        spawned = []
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    _, alive = psutil.wait_procs(spawned, timeout=10)
    for p in alive:
        p.kill()
