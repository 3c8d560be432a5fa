"""ci/metal_smoke.py: records the device it got, tells paravirtual Metal from a real GPU, always exits 0."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "metal_smoke.py"


def _module():
    spec = importlib.util.spec_from_file_location("metal_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(metal: bool = True, cuda: bool = False, vm: bool = False, display: str = "Apple M2 Pro"):
    return {"host": {"platform": "macOS-14-arm64", "virtual_machine": vm, "displays": [{"_name": display}]},
            "mlx": {"importable": True, "metal_available": metal, "cuda_available": cuda}}


def test_smoke_writes_the_device_record_and_exits_zero(tmp_path: Path) -> None:
    out = tmp_path / "device.json"
    summary = tmp_path / "summary.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                          timeout=120, env={"GITHUB_STEP_SUMMARY": str(summary), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["verdict"]
    assert record["mlx"]["importable"] is True
    assert "default_device" in record["mlx"]
    assert "MLX device on this runner" in summary.read_text()


def test_paravirtual_metal_is_never_called_a_real_gpu() -> None:
    smoke = _module()
    assert smoke.verdict(_record(vm=True, display="Apple Paravirtual device")).startswith("paravirtual")
    assert smoke.verdict(_record(vm=False, display="Apple Paravirtual device")).startswith("paravirtual")
    assert smoke.verdict(_record(vm=True)).startswith("paravirtual")
    assert smoke.verdict(_record()) == "Metal GPU"
    assert smoke.verdict(_record(metal=False)).startswith("CPU only")
    assert smoke.verdict(_record(metal=False, cuda=True)) == "CUDA GPU"


def test_a_failing_gpu_probe_is_recorded_not_raised() -> None:
    smoke = _module()
    probes: dict = {}

    def no_bf16() -> None:
        raise RuntimeError("bfloat16 is not supported on this device")

    smoke._probe("gpu_bfloat16_matmul", no_bf16, probes)
    assert probes["gpu_bfloat16_matmul"]["ok"] is False
    assert "bfloat16" in probes["gpu_bfloat16_matmul"]["error"]
