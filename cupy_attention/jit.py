"""Run-time compilation of kernel templates: NVRTC -> cubin -> CuPy module.

A kernel instantiation is a :class:`KernelSpec`: the family's source file under
``kernels/``, a C++ name expression (``flash_fwd<FlashTraits<128, 64, 64, float>,
Causal, NoDense>``) and a readable name used in logs, errors and cache files.

Compilation uses NVRTC directly (CuPy's raw binding), which needs no GPU: pass an
explicit ``arch`` and :func:`compile_spec` returns the cubin and ptxas' resource
report. At run time :func:`get_function` adds two caches in front of it:

* in process: a dict keyed by (spec, arch), so a hot call hashes nothing;
* on disk: one file per instantiation, keyed by the content of every source under
  ``kernels/``, the name expression, the options, the NVRTC version, the arch and
  the package version. Files are written atomically (temp file + ``os.replace``)
  in a directory only the user can read; a corrupt or foreign file is a miss.
  A cubin is code, so the cache is trusted only when the directory belongs to the
  current user and is not writable by group or others (a symlink to it must be
  the user's own too), and each file is a regular file (not a symlink) with the
  same owner and mode rule. Otherwise :func:`load_or_compile` warns once per
  directory and compiles into memory, reading and writing nothing there.

Environment variables:

``CUPY_ATTENTION_CACHE_DIR``   cache directory (default ``~/.cache/cupy_attention``)
``CUPY_ATTENTION_NO_CACHE=1``  skip the disk cache (compile every new process)
``CUPY_ATTENTION_DUMP_SOURCE`` directory that receives each compiled translation
                               unit, its options and the NVRTC log
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import tempfile
import stat
import threading
import warnings
from pathlib import Path

from . import __version__
from .errors import CompileError, NoDeviceError, driver_error

_MAGIC = b"CUATTN1\n"
_BASE_OPTIONS = ("-std=c++17", "-default-device", "-Xptxas=-v")


def kernels_dir() -> Path:
    """The directory that holds the CUDA sources (installed wheel or checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common").is_dir():
            return candidate
    raise FileNotFoundError(
        f"cupy_attention cannot find its CUDA sources next to {here}; reinstall the package"
    )


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel instantiation.

    source: file name under ``kernels/`` (``"flash.cu"``).
    expr:   C++ name expression of the ``__global__`` template instantiation.
    name:   readable name (``flash[D=128,BM=64,BN=64,f32,causal]``).
    """

    source: str
    expr: str
    name: str


@dataclasses.dataclass(frozen=True)
class Resources:
    """ptxas' resource report for one compiled kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_smem: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclasses.dataclass(frozen=True)
class Compiled:
    spec: KernelSpec
    arch: str
    cubin: bytes
    lowered_name: str
    log: str
    resources: Resources


# ---------------------------------------------------------------------------
# NVRTC

def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise NoDeviceError(
            "CuPy is not installed: pip install 'cupy-attention[cuda12]' "
            "(or [cuda13]) to get CuPy and NVRTC"
        ) from exc
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    try:
        return tuple(_nvrtc().getVersion())
    except Exception as exc:
        raise NoDeviceError(
            f"NVRTC could not be loaded ({exc}); install NVIDIA's NVRTC wheel "
            "(nvidia-cuda-nvrtc-cu12 for CUDA 12, nvidia-cuda-nvrtc for CUDA 13)"
        ) from exc


def supported_archs() -> list[int]:
    return list(_nvrtc().getSupportedArchs())


def arch_option(arch: str) -> str:
    return f"-arch={arch}"


def options_for(arch: str) -> tuple[str, ...]:
    return _BASE_OPTIONS + (f"-I{kernels_dir()}", arch_option(arch))


_RES_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "static_smem": re.compile(r"(\d+) bytes smem"),
}


def parse_resources(log: str) -> Resources:
    """Read registers, spills, stack frame and static shared memory off ptxas -v."""
    values = {}
    for key, rx in _RES_RE.items():
        found = [int(x) for x in rx.findall(log)]
        values[key] = max(found) if found else 0
    return Resources(**values)


def _read_source(name: str) -> str:
    return (kernels_dir() / name).read_text()


def compile_source(src: str, filename: str, exprs, arch: str, extra_options=()):
    """NVRTC for ``arch`` on a source text (include path ``kernels/``) with these
    name expressions: ``(cubin, {expr: lowered name}, log)``, or ``(None, {}, log)``
    if it does not compile. Needs no GPU. ``extra_options`` (e.g. ``-lineinfo``, for
    scripts/sass_loops.py) follow the usual ones."""
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(src, filename, [], [])
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, list(options_for(arch)) + list(extra_options))
        except nvrtc.NVRTCError:
            return None, {}, nvrtc.getProgramLog(prog)
        log = nvrtc.getProgramLog(prog)
        lowered = {expr: nvrtc.getLoweredName(prog, expr) for expr in exprs}
        return _complete_elf(nvrtc.getCUBIN(prog)), lowered, log
    finally:
        nvrtc.destroyProgram(prog)


def compile_spec(spec: KernelSpec, arch: str) -> Compiled:
    """Compile one instantiation with NVRTC for ``arch`` (e.g. ``"sm_90a"``).

    Needs no GPU. Raises :class:`CompileError` with the NVRTC log on failure.
    """
    src = _read_source(spec.source)
    cubin, lowered, log = compile_source(src, spec.source, [spec.expr], arch)
    _dump(spec, arch, src, options_for(arch), log)
    if cubin is None:
        raise CompileError(spec.name, log)
    return Compiled(spec, arch, cubin, lowered[spec.expr], log, parse_resources(log))


def _complete_elf(cubin: bytes) -> bytes:
    """Restore the cubin's tail that CuPy's ``getCUBIN`` drops.

    The binding returns NVRTC's buffer less its last byte (it treats the size as
    that of a NUL-terminated string). That byte ends the ELF program-header table,
    the high byte of the last header's 64-bit alignment: always 0. The driver loads
    the short file, but cuobjdump and nvdisasm reject it, so pad the file back to
    the end its own header declares.
    """
    if len(cubin) < 64 or not cubin.startswith(b"\x7fELF"):
        return cubin
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
    return cubin + b"\0" * (end - len(cubin)) if end > len(cubin) else cubin


def _dump(spec: KernelSpec, arch: str, src: str, opts, log: str) -> None:
    target = os.environ.get("CUPY_ATTENTION_DUMP_SOURCE")
    if not target:
        return
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    stem = _safe_name(f"{spec.name}-{arch}")
    (out / f"{stem}.cu").write_text(
        f"// {spec.name}\n// name expression: {spec.expr}\n// options: {' '.join(opts)}\n{src}"
    )
    (out / f"{stem}.log").write_text(log)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", text)


# ---------------------------------------------------------------------------
# Disk cache

_sources_digest: str | None = None
_sources_lock = threading.Lock()


def sources_digest(refresh: bool = False) -> str:
    """SHA-256 over every file under ``kernels/`` (paths and contents).

    Memoized per process: a hot call never touches the file system.
    """
    global _sources_digest
    with _sources_lock:
        if _sources_digest is None or refresh:
            h = hashlib.sha256()
            root = kernels_dir()
            for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh")):
                h.update(str(path.relative_to(root)).encode())
                h.update(b"\0")
                h.update(path.read_bytes())
                h.update(b"\0")
            _sources_digest = h.hexdigest()
        return _sources_digest


def cache_key(spec: KernelSpec, arch: str) -> str:
    h = hashlib.sha256()
    for part in (
        sources_digest(),
        spec.source,
        spec.expr,
        " ".join(_BASE_OPTIONS),
        arch,
        ".".join(map(str, nvrtc_version())),
        __version__,
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_enabled() -> bool:
    return os.environ.get("CUPY_ATTENTION_NO_CACHE", "") in ("", "0")


def cache_dir() -> Path:
    env = os.environ.get("CUPY_ATTENTION_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cupy_attention"


def cache_path(spec: KernelSpec, arch: str) -> Path:
    return cache_dir() / f"{_safe_name(spec.name)}-{arch}-{cache_key(spec, arch)[:24]}.bin"


def _encode(compiled: Compiled, key: str) -> bytes:
    meta = json.dumps({
        "key": key,
        "name": compiled.spec.name,
        "expr": compiled.spec.expr,
        "arch": compiled.arch,
        "lowered": compiled.lowered_name,
        "log": compiled.log,
    }).encode()
    body = len(meta).to_bytes(8, "little") + meta + compiled.cubin
    return _MAGIC + hashlib.sha256(body).digest() + body


def read_entry(blob: bytes):
    """(metadata dict, cubin) of a cache file's bytes; None if corrupt or truncated."""
    head = len(_MAGIC) + 32
    if len(blob) < head + 8 or not blob.startswith(_MAGIC):
        return None
    digest, body = blob[len(_MAGIC):head], blob[head:]
    if hashlib.sha256(body).digest() != digest:
        return None
    n = int.from_bytes(body[:8], "little")
    try:
        meta = json.loads(body[8:8 + n])
    except ValueError:
        return None
    return meta, body[8 + n:]


def _decode(blob: bytes, spec: KernelSpec, arch: str, key: str) -> Compiled | None:
    """A cache file as a :class:`Compiled`; None for anything corrupt or foreign."""
    entry = read_entry(blob)
    if entry is None:
        return None
    meta, cubin = entry
    if meta.get("key") != key or meta.get("expr") != spec.expr or meta.get("arch") != arch:
        return None
    log = meta.get("log", "")
    return Compiled(spec, arch, cubin, meta["lowered"], log, parse_resources(log))


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """Why ``st`` (of a cache directory or file) must not be trusted; None if it can."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{what} is owned by uid {st.st_uid}, not by the current user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by group or others (mode {stat.filemode(st.st_mode)})"
    return None


def cache_trust_problem(d: Path | None = None) -> str | None:
    """Why the cache directory ``d`` (default :func:`cache_dir`) is not trusted; None if it is.

    Creates the directory (mode 0700) when it does not exist yet.
    """
    d = cache_dir() if d is None else d
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        link = os.lstat(d)
        # A symlink's own mode is always 0777; what matters is who can repoint it.
        if stat.S_ISLNK(link.st_mode) and hasattr(os, "getuid") and link.st_uid != os.getuid():
            return f"the cache directory {d} is a symlink owned by uid {link.st_uid}"
        st = os.stat(d)
    except OSError as exc:
        return f"the cache directory {d} is not usable ({exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{d} is not a directory"
    return _untrusted(st, f"the cache directory {d}")


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_untrusted(key: str, why: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"cupy_attention: not using the kernel cache: {why}; compiling into memory "
                  "instead (fix the ownership/mode, or set CUPY_ATTENTION_CACHE_DIR to a "
                  "directory only you can write)", RuntimeWarning, stacklevel=3)


def read_trusted(path: Path) -> bytes | None:
    """The bytes of the cache file ``path`` if it exists and can be trusted, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        if path.is_symlink():
            warn_untrusted(str(path), f"the cache entry {path} is a symlink")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = (f"the cache entry {path} is not a regular file"
               if not stat.S_ISREG(st.st_mode) else _untrusted(st, f"the cache entry {path}"))
        if why:
            warn_untrusted(str(path), why)
            return None
        return f.read()


def load_or_compile(spec: KernelSpec, arch: str) -> Compiled:
    """The disk-cached :func:`compile_spec` (only in a directory that can be trusted)."""
    if not cache_enabled():
        return compile_spec(spec, arch)
    why = cache_trust_problem()
    if why is not None:
        warn_untrusted(str(cache_dir()), why)
        return compile_spec(spec, arch)
    key = cache_key(spec, arch)
    path = cache_path(spec, arch)
    blob = read_trusted(path)
    hit = None if blob is None else _decode(blob, spec, arch, key)
    if hit is not None:
        return hit
    compiled = compile_spec(spec, arch)
    _write_atomic(path, _encode(compiled, key))
    return compiled


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one:
    a temp file (mode 0600) in the same directory, fsync, rename. Raises OSError."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        write_atomic(path, data)
    except OSError:
        # A read-only or full cache directory costs a recompile next time, nothing more.
        pass


def cache_size() -> tuple[int, int]:
    """(number of entries, total bytes) of the disk cache."""
    d = cache_dir()
    if not d.is_dir():
        return 0, 0
    files = [p for p in d.glob("*.bin") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def clear_cache() -> int:
    n = 0
    d = cache_dir()
    if d.is_dir():
        for p in d.glob("*.bin"):
            p.unlink(missing_ok=True)
            n += 1
    return n


# ---------------------------------------------------------------------------
# Loading on a device

@dataclasses.dataclass
class LoadedKernel:
    compiled: Compiled
    module: object
    function: object
    max_dynamic_smem: int = 0

    def launch(self, grid, block, args, shared_mem: int, stream) -> None:
        """Launch on ``stream``. Every kernel of every family is launched here or by
        :meth:`launch_packed`, the places where a CUDA driver or runtime error of a
        launch (and of its shared-memory attribute) becomes a
        :class:`~cupy_attention.errors.DriverError` that names the kernel, the driver's
        exception as its cause."""
        try:
            self._allow_smem(shared_mem)
            self.function(grid, block, args, shared_mem=shared_mem, stream=stream)
        except Exception as exc:
            err = self._launch_error(exc, grid, block, shared_mem)
            if err is None:
                raise
            raise err from exc

    def launch_packed(self, grid, block, params, shared_mem: int, stream_ptr: int,
                      dependent: bool = False, tail: tuple = ()) -> None:
        """Launch a kernel whose one argument is a parameter struct, given as its raw
        bytes (``params``: a writable buffer, e.g. a bytearray, of the struct's size):
        cuLaunchKernel's ``extra`` buffer, with none of the per-argument conversion of
        :meth:`launch` (about 8 us less per call on an H100 host).

        ``tail``: the kernel's further arguments as ctypes objects holding their bytes
        (tensor maps: ``tma.MapBuffers``). Those go through ``kernelParams``, one pointer per
        argument, so the driver places each at the offset the cubin gives it (a
        64-byte aligned ``__grid_constant__`` map is not where a packed buffer would
        put it).

        ``dependent``: launch as the programmatic dependent of the kernel before it on
        the stream (cuLaunchKernelEx, programmatic stream serialization; sm_90+): its
        blocks may start before that kernel ends, so the kernel must call
        ``grid_dependency_wait()`` (kernels/common/pdl.cuh) before reading that
        kernel's results. Where the driver lacks cuLaunchKernelEx it is an ordinary
        launch (the wait is then a no-op)."""
        import ctypes

        from cupy.cuda import driver

        n = len(params)
        buf = (ctypes.c_char * n).from_buffer(params)
        kp = ex = 0   # kernelParams or extra: one of them
        if tail:
            kernel_params = (ctypes.c_void_p * (1 + len(tail)))(
                ctypes.addressof(buf), *(ctypes.addressof(x) for x in tail))
            kp = ctypes.addressof(kernel_params)
        else:
            size = ctypes.c_size_t(n)
            extra = (ctypes.c_void_p * 5)(_PARAM_BUFFER_POINTER, ctypes.addressof(buf),
                                          _PARAM_BUFFER_SIZE, ctypes.addressof(size), _PARAM_END)
            ex = ctypes.addressof(extra)
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        try:
            self._allow_smem(shared_mem)
            launch_ex = _launch_kernel_ex() if dependent else None
            if launch_ex is not None:
                config = _LaunchConfig(*g, *b, shared_mem, stream_ptr, _SERIALIZATION_PTR, 1)
                status = launch_ex(ctypes.addressof(config), self.function.ptr, kp or None,
                                   ex or None)
                if status:
                    raise driver.CUDADriverError(status)
            else:
                driver.launchKernel(self.function.ptr, g[0], g[1], g[2], b[0], b[1], b[2],
                                    shared_mem, stream_ptr, kp, ex)
        except Exception as exc:
            err = self._launch_error(exc, grid, block, shared_mem)
            if err is None:
                raise
            raise err from exc

    def _allow_smem(self, shared_mem: int) -> None:
        """Raise the kernel's dynamic shared-memory limit once a launch needs more than
        48 KB."""
        if shared_mem > self.max_dynamic_smem and shared_mem > 48 * 1024:
            from cupy.cuda import driver

            driver.funcSetAttribute(
                self.function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem)
            self.max_dynamic_smem = shared_mem

    def _launch_error(self, exc: Exception, grid, block, shared_mem: int):
        """The DriverError naming this kernel for a CUDA error ``exc``, else None."""
        return driver_error(exc, self.compiled.spec.name,
                            f"launching (grid {tuple(grid)}, block {tuple(block)}, "
                            f"{shared_mem} bytes of shared memory)")


class Dependent:
    """A kernel that launch lists (flash_bwd.run_passes) launch as the programmatic
    dependent of the launch before it (LoadedKernel.launch_packed's ``dependent``)."""

    def __init__(self, kernel: LoadedKernel):
        self.kernel = kernel

    def launch_packed(self, grid, block, params, shared_mem: int, stream_ptr: int,
                      tail: tuple = ()) -> None:
        self.kernel.launch_packed(grid, block, params, shared_mem, stream_ptr, dependent=True,
                                  tail=tail)


# cuLaunchKernel's `extra` keys (cuda.h: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE)
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2


def _launch_types():
    """ctypes mirrors of cuda.h's CUlaunchAttribute and CUlaunchConfig (CUDA 12+), the
    one attribute the launches use and a pointer to it."""
    import ctypes

    class Attribute(ctypes.Structure):
        # id (CUlaunchAttributeID), padding to 8 bytes, then the 64-byte value union
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_char * 64)]

    class Config(ctypes.Structure):
        _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint),
                    ("grid_z", ctypes.c_uint), ("block_x", ctypes.c_uint),
                    ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                    ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(Attribute)), ("num_attrs", ctypes.c_uint)]

    # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6, its int value 1
    serialization = Attribute(6, b"", struct.pack("<i", 1))
    return Attribute, Config, serialization, ctypes.pointer(serialization)


_LaunchAttribute, _LaunchConfig, _PROGRAMMATIC_SERIALIZATION, _SERIALIZATION_PTR = \
    _launch_types()
_launch_ex_fn: list = []   # [cuLaunchKernelEx or None], bound on first use


def _launch_kernel_ex():
    """libcuda's cuLaunchKernelEx (ctypes), or None where the driver lacks it."""
    if not _launch_ex_fn:
        import ctypes

        from .device import driver_library

        try:
            fn = driver_library().cuLaunchKernelEx
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        except (OSError, AttributeError):
            fn = None
        _launch_ex_fn.append(fn)
    return _launch_ex_fn[0]


_loaded: dict[tuple[KernelSpec, str, int], LoadedKernel] = {}
_load_lock = threading.Lock()


def get_function(spec: KernelSpec, arch: str, device_id: int) -> LoadedKernel:
    """Compiled (or cached) kernel loaded on ``device_id``; memoized per process."""
    key = (spec, arch, device_id)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    with _load_lock:
        hit = _loaded.get(key)
        if hit is not None:
            return hit
        import cupy

        compiled = load_or_compile(spec, arch)
        with cupy.cuda.Device(device_id):
            module = cupy.cuda.function.Module()
            module.load(compiled.cubin)
            function = module.get_function(compiled.lowered_name)
        loaded = LoadedKernel(compiled, module, function)
        _loaded[key] = loaded
        return loaded
