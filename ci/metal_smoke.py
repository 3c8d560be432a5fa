"""Record which device MLX really got on this runner; never fail because of Metal.

GitHub-hosted macOS arm64 runners are Apple Silicon inside Apple's
Virtualization Framework: MLX sees a paravirtual Metal device (GPU family
Apple5, no bf16, no Metal Performance Shaders), not the host's GPU. This script
writes what the runner exposed, so a paravirtual or CPU run is never read as a
real-GPU run. It exits 0 whatever it finds; only a usage error exits 2.

    python ci/metal_smoke.py [--json PATH]

With `GITHUB_STEP_SUMMARY` set, a short table is appended to the job summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import traceback
from typing import Any, Callable


def _command(*argv: str) -> str | None:
    """A command's stripped stdout, or None where it is missing or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _host() -> dict[str, Any]:
    """The machine as the OS reports it; `kern.hv_vmm_present` is 1 inside a VM."""
    host: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                            "python": platform.python_version()}
    if sys.platform == "darwin":
        host["cpu"] = _command("sysctl", "-n", "machdep.cpu.brand_string")
        host["virtual_machine"] = _command("sysctl", "-n", "kern.hv_vmm_present") == "1"
        host["displays"] = _displays()
    return host


def _displays() -> list[dict[str, str]]:
    """The GPU entries of `system_profiler` (chipset, Metal support), keys unprefixed."""
    raw = _command("system_profiler", "-json", "SPDisplaysDataType")
    if not raw:
        return []
    try:
        entries = json.loads(raw).get("SPDisplaysDataType", [])
    except ValueError:
        return []
    return [{key.replace("spdisplays_", "").replace("sppci_", ""): str(value)
             for key, value in entry.items() if not isinstance(value, (list, dict))}
            for entry in entries]


def _probe(name: str, check: Callable[[], Any], into: dict[str, Any]) -> None:
    """Run one check; its result or its error goes into the record, never out of the script."""
    try:
        into[name] = {"ok": True, "result": check()}
    except Exception as error:  # the point is to record whatever the device does
        into[name] = {"ok": False, "error": f"{type(error).__name__}: {error}",
                      "where": traceback.format_exc(limit=2).splitlines()[-1]}


def _mlx() -> dict[str, Any]:
    """What MLX reports, and whether small float32/bfloat16 work really runs on its GPU."""
    try:
        import mlx.core as mx
    except ImportError as error:
        return {"importable": False, "error": str(error)}
    record: dict[str, Any] = {"importable": True, "version": getattr(mx, "__version__", "?"),
                              "default_device": str(mx.default_device()),
                              "metal_available": bool(mx.metal.is_available()),
                              "cuda_available": bool(getattr(mx, "cuda", None) and mx.cuda.is_available())}
    probes: dict[str, Any] = {}
    _probe("device_info", lambda: {k: str(v) for k, v in mx.device_info().items()}, probes)

    def matmul(dtype: Any) -> Callable[[], str]:
        def run() -> str:
            a = mx.ones((64, 64), dtype=dtype)
            b = (a @ a).sum()
            mx.eval(b)
            return str(b.item())
        return run

    if record["metal_available"] or record["cuda_available"]:
        with mx.stream(mx.gpu):
            _probe("gpu_float32_matmul", matmul(mx.float32), probes)
            _probe("gpu_bfloat16_matmul", matmul(mx.bfloat16), probes)
    record["probes"] = probes
    return record


def verdict(record: dict[str, Any]) -> str:
    """One line: real GPU, paravirtual Metal, or CPU only."""
    mlx = record["mlx"]
    if not mlx.get("importable"):
        return "MLX not importable"
    if mlx.get("cuda_available"):
        return "CUDA GPU"
    if not mlx.get("metal_available"):
        return "CPU only (no Metal device)"
    names = " ".join(d.get("_name", "") + " " + d.get("model", "") for d in record["host"].get("displays", []))
    if record["host"].get("virtual_machine") or "paravirtual" in names.lower():
        return "paravirtual Metal (virtual machine): not a real-GPU run"
    return "Metal GPU"


def _summary(record: dict[str, Any]) -> str:
    mlx = record["mlx"]
    info = mlx.get("probes", {}).get("device_info", {}).get("result", {})
    rows = [("verdict", record["verdict"]), ("platform", record["host"]["platform"]),
            ("virtual machine", record["host"].get("virtual_machine")),
            ("MLX", mlx.get("version")), ("default device", mlx.get("default_device")),
            ("device name", info.get("device_name")), ("architecture", info.get("architecture"))]
    for name in ("gpu_float32_matmul", "gpu_bfloat16_matmul"):
        probe = mlx.get("probes", {}).get(name)
        if probe:
            rows.append((name, "ok" if probe["ok"] else probe["error"]))
    lines = ["### MLX device on this runner", "", "| | |", "| --- | --- |"]
    lines += [f"| {key} | {str(value).replace('|', '/')} |" for key, value in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the record to PATH")
    args = parser.parse_args(argv)
    record: dict[str, Any] = {"host": _host(), "mlx": _mlx()}
    record["verdict"] = verdict(record)
    text = json.dumps(record, indent=2, default=str)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as out:
            out.write(_summary(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
