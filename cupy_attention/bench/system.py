"""The report's environment: device, driver, library versions, git commit."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import cupy_attention as ca

from .. import device, jit
from ..errors import NoDeviceError


def _version(v: int) -> str | None:
    """CUDA's integer version (12090) as text ("12.9"); None for 0 (no driver)."""
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def _nvidia_smi_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.split()
    return lines[0] if res.returncode == 0 and lines else None


def system_info() -> dict:
    """What this machine offers, gathered without failing where there is no GPU.

    ``devices`` lists each CUDA device; ``no_device`` says why there is none.
    """
    info = {"cupy_attention": ca.__version__, "python": platform.python_version(),
            "cupy": None, "cuda_runtime": None, "cuda_driver": None, "driver": None,
            "nvrtc": None, "devices": [], "no_device": None,
            "cache_dir": str(jit.cache_dir()), "cache_entries": 0, "cache_bytes": 0}
    info["cache_entries"], info["cache_bytes"] = jit.cache_size()
    try:
        cupy = device.require_cupy()
    except NoDeviceError as exc:
        info["no_device"] = str(exc)
        return info
    info["cupy"] = cupy.__version__
    rt = cupy.cuda.runtime
    info["cuda_runtime"] = _version(rt.runtimeGetVersion())
    try:
        info["cuda_driver"] = _version(rt.driverGetVersion())
    except Exception:  # no driver library at all
        pass
    try:
        info["nvrtc"] = ".".join(map(str, jit.nvrtc_version()))
    except NoDeviceError as exc:
        info["nvrtc"] = None
        info["nvrtc_error"] = str(exc)
    n = device.device_count()
    if n == 0:
        info["no_device"] = "no CUDA device (no NVIDIA GPU or driver found)"
        return info
    info["driver"] = _nvidia_smi_driver()
    for i in range(n):
        props = rt.getDeviceProperties(i)
        info["devices"].append({
            "id": i, "name": device.device_name(i),
            "compute_capability": device.compute_capability(i),
            "arch": device.device_arch(i), "sms": device.multiprocessor_count(i),
            "memory_bytes": int(props["totalGlobalMem"]), "l2_bytes": int(props["l2CacheSize"]),
        })
    return info


def _git_commit() -> tuple[str | None, bool | None]:
    root = Path(ca.__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                 text=True, timeout=10)
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=root, capture_output=True, text=True, timeout=10)
            if sha.returncode == 0:
                return sha.stdout.strip(), bool(dirty.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("CUPY_ATTENTION_COMMIT"), None


def environment(torch_mod, device_id: int) -> dict:
    env = system_info()
    env["device"] = next(d for d in env.pop("devices") if d["id"] == device_id)
    env["commit"], env["dirty"] = _git_commit()
    env["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    env["command"] = shlex.join(sys.argv)
    env["torch"] = torch_mod.__version__ if torch_mod else None
    if torch_mod:
        env["torch_cuda"] = torch_mod.version.cuda
        env["cudnn"] = torch_mod.backends.cudnn.version()
    return env
