"""A real JupyterHub on loopback, with two real Unix users, for the course-hub tests.

`Hub` starts JupyterHub (this environment's `jupyterhub`, as root) with
configurable-http-proxy (npm) and `LocalProcessSpawner`: each user's single-user server runs
under that user's own uid, from `users_venv()` (users cannot run root's Python), with this
checkout's `nbcluster` and its built labextension copied into a world-readable folder of
the session. The authenticator is JupyterHub's `SharedPasswordAuthenticator` with
`allowed_users`: the test's stand-in for PAM or OAuth (what it changes is how a login is
checked, not what a logged-in user may reach).

Users are ``nbct-<pid>-a`` and ``nbct-<pid>-b`` (`useradd -m`), removed with their home
folders afterwards (`userdel -r`), with every process of their uids ended first, by pid:
their servers, kernels, supervisors and workers, kept clusters included. Users of an
earlier run whose pid is gone (a killed test session) are removed on the way in.

Cached between sessions, in world-readable folders keyed by what goes in them: the users'
venv (about a minute to build) and the proxy's npm install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.browser_helpers import ARTIFACTS, drain, labextension_dir, terminate
from tests.os_helpers import free_port
from tests.waiting import until

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NBCLUSTER_HUB_CACHE", "/var/tmp/nbcluster-hub-cache"))
SYSTEM_PYTHON = "/usr/bin/python3"
PREFIX = "nbct-"
HUB_PREFIX = "nbcluster-hub-"
PASSWORD = "course-hub-" + secrets.token_hex(8)
START_TIMEOUT_S = 120


def _locked_build(folder: Path, build: Any) -> Path:
    """`folder`, built once by `build(folder)` under a lock; a half-built one is redone."""
    CACHE.mkdir(parents=True, exist_ok=True)
    CACHE.chmod(0o755)
    done = folder / ".complete"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
            done.touch()
    return folder


def _users_requirements() -> list[str]:
    """What a single-user server needs: nbcluster's dependencies, JupyterLab, Bokeh for
    the dashboard, and the hub's own jupyterhub (for `jupyterhub-singleuser`)."""
    import jupyterhub

    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = ("jupyterlab", "bokeh")
    lab = [r for r in project["optional-dependencies"]["lab"] if re.split(r"[<>=\[ ]", r)[0] in wanted]
    return [*project["dependencies"], *lab, f"jupyterhub=={jupyterhub.__version__}"]


def users_venv() -> Path:
    """A venv every user can run, from Debian's Python, with `_users_requirements`."""
    requirements = _users_requirements()
    python = subprocess.run([SYSTEM_PYTHON, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(json.dumps([python, requirements]).encode()).hexdigest()[:16]

    def build(folder: Path) -> None:
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(folder / "bin" / "pip"), "install", "-q", *requirements], check=True)

    return _locked_build(CACHE / f"venv-{key}", build)


def proxy_command() -> Path:
    """configurable-http-proxy 5 from npm: the one on PATH (the README's test command
    installs it), else installed once into the cache."""
    installed = shutil.which("configurable-http-proxy")
    if installed:
        return Path(installed)

    def build(folder: Path) -> None:
        folder.mkdir(parents=True)
        subprocess.run(["npm", "install", "--silent", "--prefix", str(folder), "configurable-http-proxy@5"], check=True)

    return _locked_build(CACHE / "chp-5", build) / "node_modules" / ".bin" / "configurable-http-proxy"


# -- users -----------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def registry(self) -> Path:
        """nbcluster's registry folder of this user (Jupyter's default runtime dir)."""
        return self.home / ".local" / "share" / "jupyter" / "runtime" / "nbcluster"

    def run(self, args: list[str], env: dict[str, str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """`args` as this user (their uid, gid and home), as they would in a terminal."""
        return subprocess.run(
            args, user=self.uid, group=self.gid, extra_groups=[], cwd=self.home, capture_output=True, text=True,
            timeout=timeout, env={"HOME": str(self.home), "USER": self.name, **env}, **kwargs,
        )  # fmt: skip

    def processes(self) -> list[psutil.Process]:
        mine = []
        for p in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if p.info["uids"] and p.info["uids"].real == self.uid:
                    mine.append(p)
        return mine


def create_user(name: str) -> User:
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True)
    record = pwd.getpwnam(name)
    # Open to all, as many shared machines' homes are (Debian's old default): the home's
    # mode does none of the protecting, the runtime folder's and nbcluster's own modes do.
    Path(record.pw_dir).chmod(0o755)
    return User(name, record.pw_uid, record.pw_gid, Path(record.pw_dir))


def remove_user(name: str) -> None:
    """End every process of the user (by pid), then remove the user and their home."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    user = User(name, uid, 0, Path("/"))
    for _ in range(3):
        procs = user.processes()
        if not procs:
            break
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=5)
    subprocess.run(["userdel", "-r", name], capture_output=True)
    if name in {u.pw_name for u in pwd.getpwall()}:
        raise RuntimeError(f"could not remove user {name}")


def remove_stale() -> None:
    """What an earlier test session killed before its clean-up (its pid is gone) left: its
    hub and proxy (found by their working folder), their folders, and its users."""
    stale = re.compile(rf"{re.escape(tempfile.gettempdir())}/{HUB_PREFIX}(\d+)-")

    def abandoned(path: str) -> bool:
        found = stale.match(path)
        return bool(found) and not psutil.pid_exists(int(found.group(1)))  # type: ignore[union-attr]

    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if abandoned(p.cwd() + "/"):
                p.kill()
    for folder in Path(tempfile.gettempdir()).glob(f"{HUB_PREFIX}*"):
        if abandoned(f"{folder}/"):
            shutil.rmtree(folder, ignore_errors=True)
    for record in pwd.getpwall():
        found = re.fullmatch(rf"{PREFIX}(\d+)-\w+", record.pw_name)
        if found and not psutil.pid_exists(int(found.group(1))):
            remove_user(record.pw_name)


@contextlib.contextmanager
def two_users() -> Iterator[tuple[User, User]]:
    remove_stale()
    names = [f"{PREFIX}{os.getpid()}-{x}" for x in "ab"]
    made: list[User] = []
    try:
        for name in names:
            made.append(create_user(name))
        yield made[0], made[1]
    finally:
        for name in names:
            remove_user(name)


# -- the hub ---------------------------------------------------------------------------


class Hub:
    """`with Hub(users) as hub:`: hub.url (the proxy's public URL), hub.api(...) with an
    admin service token, hub.login(user) for a browser-like session."""

    def __init__(self, users: tuple[User, ...], site_settings: dict[str, Any]):
        self.users = users
        self.site_settings = site_settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(24)
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        # Named after this process, so a later session can tell an abandoned hub (`remove_stale`).
        self.private = Path(tempfile.mkdtemp(prefix=f"{HUB_PREFIX}{os.getpid()}-"))  # 0700: the hub's state
        self.shared = Path(tempfile.mkdtemp(prefix=f"{HUB_PREFIX}{os.getpid()}-users-"))  # what users read
        self.log_path = self.private / "jupyterhub.log"
        #: The environment the spawner gives each server (`as_user` runs commands in it).
        self.user_env: dict[str, str] = {}
        #: An API token of each user, by name (`user_token`).
        self.tokens: dict[str, str] = {}

    def _share_code(self) -> dict[str, str]:
        """This checkout's nbcluster, its labextension and server-extension switch, and the
        site config, in a folder every user can read and none can write: the spawner's
        environment points at them, as an administrator's would at an installed copy."""
        self.shared.chmod(0o755)
        code = self.shared / "python"
        shutil.copytree(ROOT / "nbcluster", code / "nbcluster", ignore=shutil.ignore_patterns("__pycache__", "labextension"))
        data = self.shared / "data"
        shutil.copytree(labextension_dir(), data / "labextensions" / "nbcluster")
        config = self.shared / "config"
        config.mkdir()
        (config / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}})
        )
        site = self.shared / "etc-dask"
        site.mkdir()
        (site / "nbcluster.yaml").write_text(json.dumps({"nbcluster": self.site_settings}))
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(self.shared)], check=True)
        venv = users_venv()
        self.user_env = {
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "PYTHONPATH": str(code),
            "JUPYTER_PATH": str(data),
            "JUPYTER_CONFIG_PATH": str(config),
            # The site folder, as an administrator sets it for every server the hub spawns.
            "DASK_ROOT_CONFIG": str(site),
            "NBCLUSTER_HUB_VENV": str(venv),
        }
        return self.user_env

    @property
    def site_file(self) -> Path:
        return self.shared / "etc-dask" / "nbcluster.yaml"

    def _write_config(self, env: dict[str, str]) -> Path:
        venv = env["NBCLUSTER_HUB_VENV"]
        settings = {
            "bind_url": self.url,
            "hub_ip": "127.0.0.1",
            "hub_port": free_port(),
            "proxy_api_port": free_port(),
            "users": [u.name for u in self.users],
            "password": PASSWORD,
            "token": self.token,
            "proxy": str(proxy_command()),
            "cmd": [f"{venv}/bin/jupyterhub-singleuser"],
            "env": {k: v for k, v in env.items() if k != "NBCLUSTER_HUB_VENV"},
            "db": f"sqlite:///{self.private / 'jupyterhub.sqlite'}",
            "cookie_secret": str(self.private / "cookie_secret"),
            "pid_file": str(self.private / "proxy.pid"),
        }
        path = self.private / "jupyterhub_config.py"
        path.write_text(HUB_CONFIG.format(settings=json.dumps(settings)))
        return path

    def __enter__(self) -> Hub:
        try:
            env = self._share_code()
            config = self._write_config(env)
            hub_env = {k: v for k, v in os.environ.items() if not k.startswith(("NBCLUSTER_", "DASK_", "JUPYTER"))}
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=self.private, env=hub_env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )  # fmt: skip
            threading.Thread(target=self._drain, daemon=True).start()
            if not self._ready.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
                raise RuntimeError(f"JupyterHub did not start; log:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        drain(self.proc.stdout, self.log_path, "JupyterHub is now running at", self._ready)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __exit__(self, *exc: Any) -> None:
        # SIGTERM: the hub stops the users' servers (cleanup_servers) and its proxy.
        terminate(self.proc)
        # The proxy runs in the hub's session; anything of it still there goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.proc is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "jupyterhub.log").write_text(self.log())
        shutil.rmtree(self.private, ignore_errors=True)
        shutil.rmtree(self.shared, ignore_errors=True)

    # -- HTTP ------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, Any]:  # fmt: skip
        """(status, decoded JSON or text) of `method` `path` on the proxy's public URL."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=dict(headers or {}))
        if token:
            request.add_header("Authorization", f"token {token}")
        try:
            with _NO_REDIRECTS.open(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.request(method, f"/hub/api{path}", body, token=self.token)

    def start_server(self, user: User) -> None:
        status, reply = self.api("POST", f"/users/{user.name}/server")
        assert status in (201, 202, 400), (status, reply)  # 400: already running
        self.wait_server(user, ready=True)

    def stop_server(self, user: User) -> None:
        status, reply = self.api("DELETE", f"/users/{user.name}/server")
        assert status in (202, 204), (status, reply)
        self.wait_server(user, ready=False)

    def wait_server(self, user: User, *, ready: bool, timeout: float = START_TIMEOUT_S) -> None:
        # JupyterHub's REST API has no "wait": its own clients poll the user model too.
        def reached() -> bool:
            _, model = self.api("GET", f"/users/{user.name}")
            server = (model.get("servers") or {}).get("", {})
            return bool(server.get("ready")) == ready and not server.get("pending")

        if until(reached, timeout, 0.25):
            return
        raise TimeoutError(f"{user.name}'s server not {'ready' if ready else 'stopped'}; hub log:\n{self.log()[-4000:]}")

    def user_token(self, user: User) -> str:
        status, reply = self.api("POST", f"/users/{user.name}/tokens", {"note": "nbcluster course-hub test"})
        assert status == 201, reply
        self.tokens[user.name] = str(reply["token"])
        return self.tokens[user.name]


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer to look at (a login page), not to follow


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


HUB_CONFIG = '''
# Written by tests/hub_service.py for one test session.
import json
s = json.loads({settings!r})
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = s["bind_url"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = s["hub_port"]
c.JupyterHub.db_url = s["db"]
c.JupyterHub.cookie_secret_file = s["cookie_secret"]
c.ConfigurableHTTPProxy.command = [s["proxy"]]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d" % s["proxy_api_port"]
c.ConfigurableHTTPProxy.pid_file = s["pid_file"]
# The test's stand-in for PAM or OAuth: one shared password, only the two test users.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = s["password"]
c.Authenticator.allowed_users = set(s["users"])
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = s["cmd"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.env_keep = ["LANG"]
c.Spawner.environment = s["env"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.services = [{{"name": "nbcluster-test", "api_token": s["token"]}}]
c.JupyterHub.load_roles = [{{
    "name": "nbcluster-test", "services": ["nbcluster-test"],
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "list:users", "read:users"],
}}]
'''
