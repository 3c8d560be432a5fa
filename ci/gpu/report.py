"""Turn the folders that `ci/gpu/run.sh` wrote on the GPU machine into docs/gpu.md.

    python ci/gpu/report.py RESULTS_DIR [RESULTS_DIR ...] [--out docs/gpu.md]

Each folder holds some of run.txt, device.json, fuzz.log, planted.xml, planted.log, step.json
and bench.json (one device call's $OUT). Later folders win where two hold the same file.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

FUZZ_START = re.compile(r"^== invariants fuzz --engine (\S+) --profile (\S+) --budget (\S+)(?: --jobs (\S+))?")
FUZZ_END = re.compile(r"^(?:--engine )?(\S+): (no violation in|no new finding in|VIOLATION after) (\d+) example\(s\), "
                      r"([\d.]+)s(?:: (.*))?")
PEER = "mlx_lm.server"  # the bench's name for `python -m mlx_lm.server`


def _collect(folders: list[Path]) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                files[path.name] = path
    return files


def device_section(files: dict[str, Path]) -> list[str]:
    lines = ["## Device", ""]
    if "run.txt" in files:
        smi = [line for line in files["run.txt"].read_text().splitlines() if not line.startswith("stage ")]
        if smi:
            lines += ["`nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv`:", "",
                      "```", *smi, "```", ""]
    if "device.json" in files:
        record = json.loads(files["device.json"].read_text())
        mlx = record.get("mlx", {})
        info = mlx.get("probes", {}).get("device_info", {}).get("result", {})
        rows = [("verdict (ci/metal_smoke.py)", record.get("verdict")),
                ("MLX", mlx.get("version")), ("mx.default_device()", mlx.get("default_device")),
                ("mx.device_info() device_name", info.get("device_name")),
                ("mx.device_info() architecture", info.get("architecture")),
                ("CUDA available", mlx.get("cuda_available")), ("platform", record.get("host", {}).get("platform"))]
        for probe in ("gpu_float32_matmul", "gpu_bfloat16_matmul"):
            result = mlx.get("probes", {}).get(probe)
            if result:
                rows.append((probe, "ok" if result["ok"] else result["error"]))
        lines += ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    return lines


def fuzz_runs(text: str) -> list[dict[str, Any]]:
    """One entry per route from ci/fuzz_runner.sh's log."""
    runs: list[dict[str, Any]] = []
    current: Optional[dict[str, Any]] = None
    for line in text.splitlines():
        start = FUZZ_START.match(line)
        if start:
            current = {"route": start[1], "profile": start[2], "budget": start[3], "jobs": start[4] or "-"}
            runs.append(current)
            continue
        end = FUZZ_END.match(line)
        if end and current is not None:
            current.update(examples=int(end[3]), seconds=float(end[4]),
                           violation=None if end[2] != "VIOLATION after" else (end[5] or "violation"))
        elif current is not None and line.startswith("== ") and line.endswith(tuple("0123456789")):
            current["exit"] = int(line.rsplit(" ", 1)[1])
    return runs


def fuzz_section(files: dict[str, Path]) -> list[str]:
    lines = ["## Fuzz runner, both reference routes", ""]
    log = next((files[n] for n in ("fuzz.log", "mlx_invariants.fuzz.log") if n in files), None)  # run.sh's, then its older name
    if log is None:
        return lines + ["Not run.", ""]
    text = log.read_text()
    device = next((line for line in text.splitlines() if line.startswith("device:")), "")
    lines += ["`bash ci/fuzz_runner.sh simple batched` (`invariants fuzz --engine ROUTE --profile runner "
              "--budget N --jobs J`), " + device.replace("device:", "device verdict:").strip(), "",
              "| route | profile | budget s | jobs | scenarios run | wall s | scenarios/s | violations |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in fuzz_runs(text):
        if "examples" not in run:
            lines.append(f"| {run['route']} | {run['profile']} | {run['budget']} | {run['jobs']} | - | - | - | "
                         f"did not finish (exit {run.get('exit', '?')}) |")
            continue
        rate = run["examples"] / run["seconds"] if run["seconds"] else 0.0
        lines.append(f"| {run['route']} | {run['profile']} | {run['budget']} | {run['jobs']} | {run['examples']} | "
                     f"{run['seconds']:.1f} | {rate:.2f} | {run['violation'] or 'none'} |")
    return lines + [""]


def planted_section(files: dict[str, Path]) -> list[str]:
    lines = ["## Planted bugs, found on the GPU", ""]
    if "planted.xml" not in files:
        tail = files["planted.log"].read_text().splitlines()[-15:] if "planted.log" in files else []
        return lines + ["Not run to completion." + (" Last lines:" if tail else ""), ""] + (
            ["```", *tail, "```", ""] if tail else [])
    outcomes: dict[str, dict[str, str]] = {}
    other: list[str] = []
    for case in ET.parse(files["planted.xml"]).getroot().iter("testcase"):
        outcome = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "FAILED"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        name = case.get("name", "")
        cell = f"{outcome} ({float(case.get('time', 0)):.1f} s)"
        test, _, bug = name.partition("[")
        if bug and "finds_shrinks_and_replays" in test:
            outcomes.setdefault(bug.rstrip("]"), {})["fuzz"] = cell
        elif bug and "seed_scenario" in test:
            outcomes.setdefault(bug.rstrip("]"), {})["seed"] = cell
        else:
            other.append(f"| `{name}` | {cell} | |")
    lines += ["`python -m pytest tests/mutants/test_fuzz_kills.py`: each mutant of the regression catalogue that "
              "the fuzzer must kill, planted into a copy of the engine, must be found by generation alone, shrunk "
              "to at most two requests and one fault, and its report must replay; its seed scenario must catch it "
              "and pass on the unplanted engine.", "",
              "| planted bug | found, shrunk, replayed | seed scenario |", "| --- | --- | --- |"]
    lines += [f"| `{bug}` | {cells.get('fuzz', '-')} | {cells.get('seed', '-')} |"
              for bug, cells in sorted(outcomes.items())] + other
    found = sum(cells.get("fuzz", "").startswith("passed") for cells in outcomes.values())
    lines += ["", f"{found} of {len(outcomes)} planted bugs found, shrunk and replayed on the GPU.", ""]
    return lines


def bench_section(files: dict[str, Path]) -> list[str]:
    lines = ["## Engine benchmark: batched, serialized and mlx_lm.server", ""]
    if "bench.json" not in files:
        return lines + ["Not run.", ""]
    bench = json.loads(files["bench.json"].read_text())
    meta, results = bench["meta"], bench["results"]
    peer = PEER in results
    concurrency = ",".join(str(c) for c in meta.get("concurrency", []))
    lines += [f"`python benchmarks/bench_engine.py --preset {meta.get('preset') or 'custom'}"
              f"{'' if peer else ' --no-peer'} --concurrency {concurrency}"
              f"{' --serial-max ' + str(meta['serial_max']) if meta.get('serial_max') else ''} --repeats {meta.get('repeats', 1)} "
              f"--max-tokens {meta['max_tokens']}` (random-weight llama, {meta['model'].rsplit('/', 1)[-1]}): "
              f"{meta['per_worker']} streamed request(s) per client per round, "
              f"{meta.get('repeats', 1)} round(s) {'pooled' if meta.get('repeats_are') == 'pooled' else 'median kept'}"
              f"{', servers interleaved' if meta.get('servers_are') == 'interleaved' else ''}"
              f", max batch {meta['max_batch']}; {meta['machine']}.", ""]
    by_c: dict[int, dict[str, dict[str, Any]]] = {}
    for name, result in results.items():
        for rnd in result["rounds"]:
            by_c.setdefault(rnd["concurrency"], {})[name] = rnd
    names = ["simple", "batched"] + ([PEER] if peer else [])
    floor_ms = meta.get("bandwidth_floor_ms")
    if floor_ms:
        lines += [f"Bandwidth limit: the model's parameters are {meta['parameter_bytes'] / 1e6:.1f} MB (safetensors "
                  f"headers); at {meta['bandwidth_gbs']:g} GB/s a decode step cannot take less than {floor_ms:.3f} ms, "
                  "so a batch of b sequences cannot exceed b / that tok/s. *Share* is tok/s over that limit "
                  "(the serialized route decodes a batch of one at any c).", ""]
    if meta.get("peer_launch"):
        lines += [f"Peer: {meta['peer_launch']}.", ""]
    header = ["c", *(f"{n} tok/s" for n in names), "batched / simple"] + (["batched / peer"] if peer else [])
    header += [f"share {n}" for n in names] if floor_ms else []
    header += [f"TTFT p50 ms {n}" for n in names]
    lines += ["| " + " | ".join(header) + " |", "|" + " ---: |" * len(header)]
    for c in sorted(by_c):
        row = by_c[c]
        cells = [str(c), *(_num(row.get(n), "tok_s") for n in names), _ratio(row, "batched", "simple")]
        cells += [_ratio(row, "batched", PEER)] if peer else []
        cells += [_share(row.get(n), n, floor_ms, meta["max_batch"]) for n in names] if floor_ms else []
        cells += [_num(row.get(n), "ttft_p50_ms") for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    probe = meta.get("peer_unmodified")
    if probe:
        lines += ["", f"The unmodified `mlx_lm.server` (listen backlog 5), one round at c={probe['concurrency']}: "
                      + ("completed." if probe["completed"] else f"failed, `{probe['error']}`.")]
    lates = {n: results[n]["late"] for n in names if results.get(n, {}).get("late")}
    if lates:
        lines += ["", "Late arrival: a short request sent while a long one streams (median of the trials).", "",
                  "| server | decode step ms | late-arrival TTFT ms | in decode steps | same request idle TTFT ms "
                  "| excess over idle, steps |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {n} | {_num(late, 'step_ms')} | {_num(late, 'ttft_ms')} | {_num(late, 'steps')} | "
                  f"{_num(late, 'idle_ttft_ms')} | {_num(results[n], 'late_excess_steps')} |"
                  for n, late in lates.items()]
    if bench.get("targets"):
        lines += ["", "| target | measured | verdict |", "| --- | --- | --- |"]
        lines += [f"| {t['name']} | {t['measured']} | {t['verdict']} |" for t in bench["targets"]]
    return lines + [""]


def _share(row: Optional[dict[str, Any]], name: str, floor_ms: float, max_batch: int) -> str:
    if not row:
        return "-"
    batch = 1 if name == "simple" else min(row["concurrency"], max_batch)
    return f"{row['tok_s'] * floor_ms / 1000 / batch:.1%}"


def step_section(files: dict[str, Path]) -> list[str]:
    """benchmarks/bench_decode_step.py's profile of one decode step, in-process."""
    lines = ["## One decode step, taken apart", ""]
    if "step.json" not in files:
        return lines + ["Not run.", ""]
    step = json.loads(files["step.json"].read_text())
    floor = step.get("bandwidth_floor_ms")
    lines += [f"`python benchmarks/bench_decode_step.py --preset 0.5b` on {step['device']} (MLX {step['mlx']}): "
              f"{step['parameter_bytes'] / 1e6:.1f} MB of parameters"
              + (f", bandwidth floor {floor:.3f} ms a step" if floor else "") + ". Steady-state step times, "
              "median of 64 pipelined steps, in-process (no HTTP); serialized route (`generate_step`, one "
              f"`KVCache`, no mask): {step['serial_ms']:.2f} ms.", "",
              "| batch | array mask (before), rows unpadded | host-padded (after), rows unpadded | "
              "host-padded, rows padded |", "| ---: | ---: | ---: | ---: |"]
    for row in step["steps"]:
        cells = [row.get(k) for k in ("array_mask_unpadded", "host_padded_unpadded", "host_padded_padded")]
        lines.append(f"| {row['batch']} | " + " | ".join(
            "-" if c is None else f"{c['ms']:.2f} ms{' (mask)' if c['array_mask'] else ''}" for c in cells) + " |")
    lines += ["", "One step at a time, unpipelined (medians of 16): Python building the graph (model call, "
                  "log-softmax, sampling), `mx.async_eval` (MLX walks the graph and encodes every kernel), the "
                  "wait for the GPU, `tolist()`; primitives in the step's graph, views excluded.", "",
              "| step | build ms | encode ms | wait ms | read ms | primitives |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, part in step["parts"].items():
        lines.append(f"| {name} | {part['build_ms']:.2f} | {part['encode_ms']:.2f} | {part['wait_ms']:.2f} | "
                     f"{part['read_ms']:.3f} | {part['primitives']} |")
    gaps = step.get("engine_gap_ms") or {}
    if gaps and "error" not in gaps:
        lines += ["", "Each route in-process (no HTTP; a process of its own), one 128-token request: median gap between "
                      "tokens on the event loop: " + ", ".join(f"{k} {v:.2f} ms" for k, v in gaps.items()) + "."]
    tried = step.get("tried") or {}
    variants = step.get("env_variants") or {}
    if tried or variants:
        lines += ["", "Variants (each environment in a fresh process; batch-1/2/8 pipelined step ms, and the "
                      "batch-1 step's encode ms):", "",
                  "| variant | serialized | batch 1 | batch 2 | batch 8 | batch 2 padded | batch 1 encode |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, v in variants.items():
            if "error" in v:
                lines.append(f"| {name} | failed: {v['error'][-120:]!r} | | | | | |")
                continue
            lines.append(f"| {name} | {v['serial_ms']:.2f} | {v['batch 1 unpadded']:.2f} | {v['batch 2 unpadded']:.2f} | "
                         f"{v['batch 8 unpadded']:.2f} | {v['batch 2 padded']:.2f} | "
                         f"{v['parts batch 1']['encode_ms']:.2f} |")
        for name, v in tried.items():
            lines.append(f"| {name} (in the main process) | | {v['ms']:.2f} | | | | |")
    return lines + [""]


def _ratio(row: dict[str, dict[str, Any]], top: str, bottom: str) -> str:
    a, b = row.get(top), row.get(bottom)
    return f"{a['tok_s'] / b['tok_s']:.2f}x" if a and b and b.get("tok_s") else "-"


def _num(row: Optional[dict[str, Any]], key: str) -> str:
    return f"{row[key]:.1f}" if row and row.get(key) is not None else "-"


def stages_section(folders: list[Path]) -> list[str]:
    stages = [line for folder in folders if (folder / "run.txt").is_file()
              for line in (folder / "run.txt").read_text().splitlines() if line.startswith("stage ")]
    return ["## Stages", "", *[f"- {line}" for line in stages], ""] if stages else []


def render(folders: list[Path], commit: str) -> str:
    files = _collect(folders)
    lines = ["# GPU evidence: the harness on MLX's CUDA backend", "",
             "Produced by `ci/gpu/run.sh` on a lent NVIDIA machine (see docs/ci.md, \"GPU run\") and "
             f"rendered by `ci/gpu/report.py`, at commit `{commit}`. MLX's CUDA backend is the closest "
             "thing to Apple Silicon available here: the thread-affinity failure (\"There is no "
             "Stream(gpu, 1) in current thread\") reproduces on it exactly.", ""]
    for section in (device_section, fuzz_section, planted_section, step_section, bench_section):
        lines += section(files)
    lines += stages_section(folders)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    parser.add_argument("--commit", help="the commit the run was made at (default: HEAD)")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"report: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True, check=False).stdout.strip() or "unknown"
    text = render(args.folders, commit)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
