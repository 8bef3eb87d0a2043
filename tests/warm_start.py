"""A warm start for ``python -m gatekeeper`` in tests (issue #28).

Most of a demo run's time is spent importing torch, transformers and lm-eval (about 4 s of CPU of
a run's 8), and the tests start the CLI as a subprocess hundreds of times. Each test worker
starts one server process (``python tests/warm_start.py DIR``) that imports those libraries once
and then forks a child for every ``python -m gatekeeper[.action] ...`` a test starts, and every
``gatekeeper ...`` console script (a workflow's ``run:`` step) of the same interpreter. The child
takes the process's argv, environment, working directory, umask and its stdin/stdout/stderr,
imports gatekeeper fresh from that process's own ``sys.path`` (a pull request's planted module
is found as it would be), runs the module (or the script file itself) as ``__main__`` and hands
back the exit code. Every subprocess call, its exit code and its output stay real; only the
import is shared.

The hook is a ``.pth`` line in the virtual environment (the way coverage.py measures
subprocesses). It does nothing unless ``GATEKEEPER_TEST_WARM`` is set, and the process starts
cold, as it always did, whenever the warm child could differ from a fresh interpreter:

- another interpreter (a fresh clone's venv, the container), user, group or interpreter flags;
- a folder on the process's own path (its working directory, ``PYTHONPATH``) holds a module
  with the name of one the server imported;
- the process leads its own process group (a test that kills the group, as a preempted runner).

A process whose environment differs from the server's in a variable a library could read at
import (everything but the names in ``VOLATILE``: gatekeeper reads those itself, and gatekeeper is
never pre-imported) is never run by that server. It starts cold, unless its test sets
``GATEKEEPER_TEST_WARM_OWN_SERVER=1`` for processes that share an environment and load a model (a
loopback hub's ``HF_ENDPOINT`` and ``HF_HOME``): then the first of them starts a server of that
environment (``env-KEY/`` beside the first server's files: the same imports under exactly that
environment, about what the cold start of a run that loads a model costs) and runs in it, and every
later process of that environment runs warm there. Such servers end with the test that started
them (tests/conftest.py), or with the test worker. Not every test opts in: a process that stops
before it loads a model imports far less cold than a server does.

``GATEKEEPER_TEST_COLD=1`` turns it off for a whole run (scripts/test.sh passes it through), and
tests/test_warm_start.py checks that a warm and a cold run of the same commands agree. A test
file that leaves a variable set in the test process (which would send every later subprocess of
its worker cold, silently) fails at its end (tests/conftest.py); ``GATEKEEPER_TEST_WARM_WHY=FILE``
writes why each process started cold.
"""

from __future__ import annotations

import os
import sys

ENV = "GATEKEEPER_TEST_WARM"  # the server's info file (JSON), set by tests/conftest.py
HOOK_ENV = "GATEKEEPER_TEST_WARM_HOOK"  # this file, which the .pth line runs in every new interpreter
COLD_ENV = "GATEKEEPER_TEST_COLD"
# Set by a test whose processes share an environment other than the server's and load a model
# (a loopback hub's): the first starts a server of that environment, the rest run warm in it.
OWN_SERVER_ENV = "GATEKEEPER_TEST_WARM_OWN_SERVER"
ENV_SERVER_PREFIX = "env-"  # a server of another environment: env-KEY/ beside the first server's files
WHY_ENV = "GATEKEEPER_TEST_WARM_WHY"  # a file: each process that starts cold adds why, and its command
MODULES = ("gatekeeper", "gatekeeper.action")
SCRIPT = "gatekeeper"  # the console script pip writes: a script file of this name run by the server's interpreter
# What the server imports: everything heavy a CLI run of the demo imports, and nothing of gatekeeper.
PRELOAD = ("numpy", "scipy.stats", "yaml", "requests", "jinja2", "torch", "transformers", "datasets",
           "lm_eval", "lm_eval.api.registry", "lm_eval.evaluator", "lm_eval.tasks", "lm_eval.models.huggingface",
           "transformers.models.gpt2.modeling_gpt2", "transformers.models.auto.modeling_auto", "sklearn")
# Read by gatekeeper or the test itself, at run time: these may differ between the server and a run.
# MLFLOW_*: gatekeeper's tracking sets them in the test process; mlflow is not pre-imported, and
# transformers reads them only when its MLflow callback runs. _MLFLOW_*: mlflow sets
# _MLFLOW_TELEMETRY_SESSION_ID in any process that imports it (a test logging in-process), and only
# mlflow reads it; before it was here, every later subprocess of that test worker started cold.
VOLATILE_PREFIXES = ("GITHUB_", "INPUT_", "RUNNER_", "GATEKEEPER_", "PYTEST_", "ACTIONS_", "MLFLOW_", "_MLFLOW_")
# Read only when used, never at import (checked in their sources): TOKENIZERS_PARALLELISM, which
# transformers and datasets set in the test process once it has run a model, and API keys.
# HF_TOKEN: huggingface_hub reads it in get_token(), at each call. The workflows' step variables
# (OUT, SHARD, PART, BASE_SHA, DONE, RESULTS, VERDICTS) are read by the step's shell; no installed
# package reads them from the environment (checked: grep of site-packages for each name).
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PYTHONPATH", "TOKENIZERS_PARALLELISM", "HF_TOKEN",
                      "OUT", "SHARD", "PART", "BASE_SHA", "DONE", "RESULTS", "VERDICTS"})
VOLATILE_SUFFIXES = ("_API_KEY",)
PTH_NAME = "zz_gatekeeper_test_warm.pth"  # last of the .pth files: sys.path is whole when it runs
PTH_LINE = ("import os, sys; os.environ.get('GATEKEEPER_TEST_WARM') and len(sys.orig_argv) > 1 and "
            f"(sys.orig_argv[1] == '-m' or os.path.basename(sys.orig_argv[1]) == '{SCRIPT}') and "
            "__import__('runpy').run_path(os.environ['GATEKEEPER_TEST_WARM_HOOK'], run_name='gatekeeper_warm')\n")


def env_key(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k not in VOLATILE and not k.startswith(VOLATILE_PREFIXES) and not k.endswith(VOLATILE_SUFFIXES)}


def env_differs(env: dict[str, str], info: dict) -> list[str]:
    """The variables that make a process with ``env`` differ from the server (``info``, its
    info.json) at import; none: it may run warm."""
    key = env_key(env)
    for name, value in info["added"].items():  # what the import sets anyway (a test process that imported torch)
        if key.get(name) == value:
            del key[name]
    own_bin = os.path.dirname(sys.executable)  # the workflow emulator puts the runner's `python` first on PATH
    if key.get("PATH", "").startswith(own_bin + os.pathsep) and key["PATH"][len(own_bin) + 1:] == info["env"].get("PATH"):
        key["PATH"] = info["env"]["PATH"]
    return sorted(k for k in set(key) | set(info["env"]) if key.get(k) != info["env"].get(k))


def _ids() -> list[int]:
    return [os.getuid(), os.getgid(), *sorted(os.getgroups())]


# ----------------------------------------------------------------------------- the client (the hook)


def _shadows(folders: list[str], modules: set[str]) -> str | None:
    """The first thing in ``folders`` an import of one of ``modules`` could find: a folder (a
    package) or a module file of that name. Commands without a suffix (a venv's bin/tqdm) are not."""
    from importlib.machinery import all_suffixes

    suffixes = tuple(all_suffixes())
    for folder in folders:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            top = name.split(".", 1)[0]
            if top in modules and (name.endswith(suffixes) if name != top else os.path.isdir(os.path.join(folder, name))):
                return os.path.join(folder, name)
    return None


def _target(argv: list[str]) -> tuple[dict, list[str]] | None:
    """What this interpreter was started to run, and its arguments: ``-m`` one of MODULES, or a
    script file named SCRIPT (the console script) by its absolute path (a relative one is
    ``__file__``'s absolute path but sys.argv[0] as given); None for anything else."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in MODULES:
        return {"module": argv[2]}, argv[3:]
    if len(argv) >= 2 and os.path.basename(argv[1]) == SCRIPT and os.path.isabs(argv[1]) and _is_script(argv[1]):
        return {"script": argv[1]}, argv[2:]
    return None


def _is_script(path: str) -> bool:
    """A text script with a #! line, as pip writes console scripts (not a folder or a zip archive,
    which the interpreter runs differently)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def _warm_request() -> tuple[dict, dict] | str:
    """What the server needs to run this process, or why it must start cold."""
    argv = sys.orig_argv
    target = _target(argv)
    if target is None or os.environ.get(COLD_ENV):
        return "not a gatekeeper module or script, or the warm start is off"
    info = _server_info(os.environ.get(ENV, ""))
    if info is None:
        return "no server"
    if [sys.executable, _ids()] != [info["executable"], info["ids"]]:
        return "another interpreter, user or group"
    if os.getpgid(0) == os.getpid():
        return "leads its process group"
    differs = env_differs(dict(os.environ), info)
    if differs:
        if not os.environ.get(OWN_SERVER_ENV):
            return "environment differs: " + ", ".join(differs)
        info = _env_server(info)
        if info is None:
            return "environment differs, and no server of its own came up: " + ", ".join(differs)
    if list(sys.flags) != info["flags"]:
        return "other interpreter flags"
    path = list(sys.path)
    if not set(info["sys_path"]) <= set(path):
        return "sys.path lacks the server's folders"
    run, args = target
    # What the interpreter puts first, after site has run: the working directory for -m, the
    # script's folder (symbolic links resolved) for a script.
    if sys.flags.safe_path:
        first = []
    elif "script" in run:
        first = [os.path.dirname(os.path.realpath(run["script"]))]
    else:
        first = [os.getcwd()]
    extra = first + [p for p in path if p not in info["sys_path"]]
    shadow = _shadows(extra, set(info["modules"]))
    if shadow:
        return f"{shadow} shadows a module the server imported"
    request = {**run, "args": args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": _umask(),
               "sys_path": first + path}
    return info, request


def _env_key_hash(env: dict[str, str]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(env_key(env), sort_keys=True).encode()).hexdigest()[:16]


def _env_server(first: dict) -> dict | None:
    """The info of the server of this process's environment, started now if there is none (see
    the module's docstring); None if it did not come up."""
    import fcntl
    import subprocess

    folder = os.path.join(os.path.dirname(os.environ[ENV]), ENV_SERVER_PREFIX + _env_key_hash(dict(os.environ)))
    with open(folder + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes of one environment start one server
        if not os.path.isdir(folder):
            os.mkdir(folder)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the server's own path stays its own
            with open(os.path.join(folder, "log"), "wb") as log:
                server = subprocess.Popen([sys.executable, os.environ[HOOK_ENV], folder, str(first["worker"]),
                                           first["ledger"]], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          cwd=folder, env=env, start_new_session=True)
            with open(os.path.join(folder, "pid"), "w", encoding="utf-8") as fh:
                fh.write(str(server.pid))
    info = _server_info(os.path.join(folder, "info.json"), wait_s=300)
    if info is None or env_differs(dict(os.environ), info):
        return None
    return info


def _server_info(path: str, wait_s: float = 60) -> dict | None:
    """The server's info; while it is still importing (a few seconds at the start of a test run),
    wait for it: a cold start would cost as much."""
    import json
    import time

    folder = os.path.dirname(path)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            pass
        try:
            with open(os.path.join(folder, "pid"), encoding="utf-8") as fh:
                os.kill(int(fh.read()), 0)  # still starting
        except (OSError, ValueError):
            return None  # never started, refused to serve, or gone
        time.sleep(0.1)
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def client() -> None:
    """Run this process's ``-m gatekeeper...`` in a warm child; return (and start cold) if it can't."""
    if getattr(sys, "_gatekeeper_warm_checked", False):
        return  # site runs a .pth twice where lib64 links to lib
    sys._gatekeeper_warm_checked = True
    found = _warm_request()
    if isinstance(found, str):
        if os.environ.get(WHY_ENV):
            try:
                with open(os.environ[WHY_ENV], "a", encoding="utf-8") as fh:
                    fh.write(f"{found}: {' '.join(sys.orig_argv[1:5])} in {os.getcwd()}\n")
            except OSError:
                pass  # another user's process
        return
    import json
    import signal
    import socket

    info, request = found
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(info["socket"])
        body = json.dumps(request).encode()
        socket.send_fds(sock, [len(body).to_bytes(8, "big") + body], [0, 1, 2])
        reader = sock.makefile("rb")
        pid = int(reader.readline())
    except (OSError, ValueError):
        sock.close()
        return  # nothing ran: start cold
    # The test signals this process; the child is the one running.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    status = reader.readline()
    try:
        code = int(status)
    except ValueError:
        os.write(2, b"warm start: the run ended without an exit status (killed?)\n")
        code = 70
    os._exit(code)


# ----------------------------------------------------------------------------- the server


def _top_modules() -> list[str]:
    return sorted({name.split(".", 1)[0] for name in sys.modules} - set(sys.builtin_module_names))


def _child(conn, ledger: str, added: dict[str, str]) -> None:
    """In the forked child: become the client's process and run its module. Never returns."""
    import atexit
    import importlib
    import json
    import resource
    import runpy
    import signal
    import socket
    import threading
    import traceback

    code = 70
    try:
        head, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
        size = int.from_bytes(head[:8], "big")
        body = head[8:]
        while len(body) < size:
            more = conn.recv(size - len(body))
            if not more:
                raise OSError("the client went away")
            body += more
        request = json.loads(body)
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as CPython sets it at start-up
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(added)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        sys.path[:] = request["sys_path"]
        importlib.invalidate_caches()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # a fresh interpreter's global generator is seeded afresh
        conn.sendall(f"{os.getpid()}\n".encode())

        def watch() -> None:  # the client was killed (a test's timeout): so is this run
            try:
                conn.recv(1)
            finally:
                os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        sys.argv[:] = [request.get("script", "-m"), *request["args"]]  # as the interpreter leaves it
        code = _run(request, runpy, traceback)
        threading._shutdown()  # noqa: SLF001 - what the interpreter does at exit: join non-daemon threads
        atexit._run_exitfuncs()  # noqa: SLF001
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    except BaseException:  # noqa: BLE001 - the child must always hand back a status
        traceback.print_exc()
    finally:
        try:
            own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
            with open(ledger, "a", encoding="utf-8") as fh:
                fh.write(f"{cpu:.3f}\n")
            conn.sendall(f"{code}\n".encode())
        finally:
            os._exit(code & 0xFF)


def _run(request: dict, runpy, traceback) -> int:
    try:
        if "script" in request:
            runpy.run_path(request["script"], run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            return 0
        if isinstance(stop.code, int):
            return stop.code
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        traceback.print_exc()
        return 1
    return 0


def serve(folder: str, worker: int, ledger: str) -> None:
    """Import, then run each client's process in a forked child, for as long as the test worker
    ``worker`` lives; each child adds its CPU seconds to ``ledger``, and a server of its own
    environment adds its import's ("SECONDS import")."""
    import importlib
    import io
    import json
    import resource
    import socket

    pid_path = os.path.join(folder, "pid")  # written by whoever started it: clients wait while it imports

    env_before = dict(os.environ)
    noise = io.StringIO()
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = noise
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # not installed (the gate without lm-eval): a run that needs it fails as it would cold
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    if noise.getvalue() or any(m == "gatekeeper" or m.startswith("gatekeeper.") for m in sys.modules):
        print(f"warm start: not serving (imports printed {noise.getvalue()[:500]!r})", file=sys.stderr)
        os.unlink(pid_path)  # clients stop waiting
        return
    sock_path, info_path = os.path.join(folder, "s"), os.path.join(folder, "info.json")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    # Importing torch and huggingface_hub sets a few variables; a warm child sets them as its import would have.
    added = {k: v for k, v in os.environ.items() if env_before.get(k) != v}
    info = {"executable": sys.executable, "flags": list(sys.flags), "ids": _ids(), "env": env_key(env_before),
            "added": added, "sys_path": sys.path if sys.flags.safe_path else sys.path[1:],  # not this file's folder
            "modules": _top_modules(), "socket": sock_path, "worker": worker, "ledger": ledger}
    if os.path.basename(folder).startswith(ENV_SERVER_PREFIX):  # its import is the cost of the test that started it
        used = resource.getrusage(resource.RUSAGE_SELF)
        with open(ledger, "a", encoding="utf-8") as fh:
            fh.write(f"{used.ru_utime + used.ru_stime:.3f} import\n")
    with open(info_path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    os.replace(info_path + ".tmp", info_path)  # clients see the server only once it is whole
    while _alive(worker):  # the test worker is gone: so is the server
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.settimeout(None)
            _child(conn, ledger, added)
        conn.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "gatekeeper_warm":
    client()
elif __name__ == "__main__":  # FOLDER [WORKER LEDGER]: the first server is started by the test worker itself
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid(),
          sys.argv[3] if len(sys.argv) > 3 else os.path.join(sys.argv[1], "cpu"))
