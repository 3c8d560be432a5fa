"""The sentinel's records file, written by one process and read by another while it grows: a reader that takes
the file's size in the middle of a line, or meets a line a killed writer left half written, goes on."""

from __future__ import annotations

import os
from pathlib import Path

from mlx_invariants.fuzz.sentinel import file_emitter, read_records
from mlx_invariants.fuzz.trace import Event

LONG_STACK = tuple(f"/some/where/module_{i}.py:{i} in frame_{i}" for i in range(400))  # a line over 8 KiB


def _span(seq: int) -> Event:
    return Event(seq, "mlx", "mlx.core:eval", stack=LONG_STACK)


def test_a_size_taken_in_the_middle_of_a_line_reads_from_the_next_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    emit = file_emitter(str(path))
    emit(_span(1))
    first_end = path.stat().st_size
    emit(_span(2))
    middle = first_end + 5000  # inside the second line, as a stat() during its write would see it
    assert [e.seq for e in read_records(str(path), middle)[0]] == []
    emit(_span(3))
    events, offset = read_records(str(path), middle)
    assert [e.seq for e in events] == [3]
    assert offset == path.stat().st_size
    assert [e.seq for e in read_records(str(path), first_end)[0]] == [2, 3]
    assert [e.seq for e in read_records(str(path), 0)[0]] == [1, 2, 3]


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    file_emitter(str(path))(_span(1))
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:3000])  # the next line's first piece, not yet its end
    events, offset = read_records(str(path), 0)
    assert [e.seq for e in events] == [1] and offset == len(whole)
    with open(path, "ab") as handle:
        handle.write(whole[3000:])
    assert [e.seq for e in read_records(str(path), offset)[0]] == [1]


def test_a_half_line_left_by_a_killed_writer_does_not_hide_the_lines_after_it(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    emit = file_emitter(str(path))
    emit(_span(1))
    with open(path, "ab") as handle:
        handle.write(path.read_bytes()[:3000])  # a writer killed here; the next process appends after it
    emit(_span(2))
    assert [e.seq for e in read_records(str(path), 0)[0]] == [1, 2]


def test_each_record_is_one_write(tmp_path: Path, monkeypatch):
    """A line written in pieces is what a kill, or a fork in another thread, can cut."""
    path = tmp_path / "records.jsonl"
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(len(data)) or real_write(fd, data))
    file_emitter(str(path))(_span(1))
    assert len(writes) == 1 and writes[0] == path.stat().st_size > 8192
