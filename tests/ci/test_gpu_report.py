"""ci/gpu/report.py renders what ci/gpu/run.sh brings back: device, fuzz counts, planted bugs, benchmark."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "ci" / "gpu" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FUZZ_LOG = """\
device: CUDA GPU
== invariants fuzz --engine simple --profile runner --budget 120 --jobs 4
--engine simple: no violation in 480 example(s), 120.3s
== simple: exit 0
== invariants fuzz --engine batched --profile runner --budget 120
--engine batched: VIOLATION after 12 example(s), 30.0s: slot-freed-early: freed while the worker ran
report: fuzz-reports/batched/x/report.txt
== batched: exit 1
"""

PLANTED_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.fuzz.test_planted" name="test_fuzzer_finds_shrinks_and_replays_planted_bug[lock-freed-on-cancel]" time="4.2"/>
<testcase classname="tests.fuzz.test_planted" name="test_fuzzer_finds_shrinks_and_replays_planted_bug[nested-reacquire]" time="9.9">
<failure message="not found">not found</failure></testcase>
</testsuite></testsuites>
"""


def _bench() -> dict:
    def rnd(c: int, tok_s: float) -> dict:
        return {"concurrency": c, "tok_s": tok_s, "ttft_p50_ms": 10.0, "ttft_p90_ms": 20.0,
                "completion_tokens": 64 * c, "wall_s": 1.0}
    return {"meta": {"max_tokens": 64, "repeats": 3, "per_worker": 2, "max_batch": 8, "machine": "Linux x86_64, MLX gpu",
                     "preset": "0.5b", "model": "/cache/0.5b-llama-abc", "concurrency": [1, 4, 8]},
            "results": {"simple": {"rounds": [rnd(1, 100.0), rnd(4, 100.0), rnd(8, 100.0)]},
                        "batched": {"rounds": [rnd(1, 100.0), rnd(4, 350.0), rnd(8, 600.0)]}},
            "targets": []}


def test_report_has_fuzz_counts_planted_outcomes_and_the_batched_ratio(tmp_path: Path) -> None:
    first, second = tmp_path / "call2", tmp_path / "call3"
    first.mkdir()
    second.mkdir()
    (first / "run.txt").write_text("name, driver_version\nNVIDIA H100 80GB HBM3, 580.1\nstage fuzz: exit 1 in 150s\n")
    (first / "mlx_invariants.fuzz.log").write_text(FUZZ_LOG)
    (first / "bench.json").write_text(json.dumps(_bench()))
    (second / "planted.xml").write_text(PLANTED_XML)
    text = _report().render([first, second], "abc1234")
    assert "NVIDIA H100 80GB HBM3" in text
    assert "| simple | runner | 120 | 4 | 480 | 120.3 | 3.99 | none |" in text
    assert "| batched | runner | 120 | - | 12 | 30.0 |" in text
    assert "slot-freed-early" in text
    assert "| `lock-freed-on-cancel` | passed (4.2 s) | - |" in text
    assert "| `nested-reacquire` | FAILED (9.9 s) | - |" in text
    assert "1 of 2 planted bugs found, shrunk and replayed on the GPU." in text
    assert "| 8 | 100.0 | 600.0 | 6.00x |" in text
    assert "--no-peer" in text and "batched / peer" not in text
    assert "stage fuzz: exit 1 in 150s" in text
    assert "--repeats 3 --max-tokens 64" in text


def test_report_shows_the_peer_and_late_arrival_when_measured(tmp_path: Path) -> None:
    bench = _bench()
    late = {"ttft_ms": 30.0, "step_ms": 3.0, "steps": 10.0, "long_tokens_waited": 4, "idle_ttft_ms": 24.0}
    for name, result in bench["results"].items():
        result.update(late=late, late_excess_steps=2.0)
    bench["results"]["mlx_lm.server"] = {"rounds": [{**r, "tok_s": 200.0} for r in bench["results"]["simple"]["rounds"]],
                                         "late": late | {"ttft_ms": 300.0}, "late_excess_steps": 92.0}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    text = _report().render([tmp_path], "abc1234")
    assert "--no-peer" not in text
    assert "| 8 | 100.0 | 600.0 | 200.0 | 6.00x | 3.00x |" in text
    assert "| mlx_lm.server | 3.0 | 300.0 | 10.0 | 24.0 | 92.0 |" in text


def test_missing_parts_say_not_run(tmp_path: Path) -> None:
    text = _report().render([tmp_path], "abc1234")
    assert text.count("Not run") >= 2
