"""``--output`` of a data-parallel ``bass generate`` (torchrun, several groups) behaves as
one process's: a run without ``--resume`` replaces the file (no stale row of an earlier
run stays, nor its shards), ``--resume`` continues it (one process too, from the shards a
stopped data-parallel run left), and a file another run writes is refused on every rank."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import pytest
from cli_support import (
    hold,
    one_error_line,
    read_jsonl,
    release,
    run,
    save_model_dir,
    subprocess_env,
)

from bass.cli import scaleout
from bass.cli.errors import UsageError
from bass.cli.rows import print_merged
from bass.distributed import Topology

FLAGS = "--dtype float64 --cpu-linear torch --samples 2 --sample --seed 3 --max-new-tokens 4"
PROMPTS = ["hello world", "the sea is blue", "a cat"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


def torchrun(model_dir, out, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "bass", "generate", "--main", model_dir, *FLAGS.split(), "--no-progress",
           "-o", str(out), *extra, *PROMPTS]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=subprocess_env())


def rows_of(path) -> list[tuple]:
    return [(r["prompt_index"], r["sample"], r["completion"]) for r in read_jsonl(path)]


def stale_row(i: int) -> str:
    return json.dumps({"prompt": "stale", "prompt_index": i, "sample": 0, "completion": "old"})


def test_a_data_parallel_run_replaces_the_output_and_a_held_one_is_refused_on_every_rank(
    model_dir, tmp_path, capsys
):
    out = tmp_path / "out.jsonl"
    out.write_text("".join(stale_row(i) + "\n" for i in range(5)))  # an earlier run's rows
    for r in (0, 3):  # the shards a stopped run left (this run writes rank 0's; never rank 3)
        out.with_name(f"out.jsonl.rank{r}").write_text(stale_row(r) + "\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}

    proc = hold(f"generate hello -o {out} --overwrite")
    try:
        refused = torchrun(model_dir, out, "--overwrite")
    finally:
        release(proc)
    assert refused.returncode != 0
    said = refused.stderr.count("is being written by another bass run (pid")
    assert said == 2, refused.stderr[-3000:]  # each rank says why it stopped
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before  # nothing touched

    done = torchrun(model_dir, out, "--overwrite")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(out)
    keys = [(i, s) for i in range(len(PROMPTS)) for s in range(2)]
    assert [(r["prompt_index"], r["sample"]) for r in rows] == keys  # only this run's rows
    assert [r["prompt"] for r in rows] == [p for p in PROMPTS for _ in range(2)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no shard, no lock
    one = tmp_path / "one.jsonl"
    rc, _, err = run(capsys, f"generate --main {model_dir} {FLAGS} -o {one}", *PROMPTS)
    assert rc == 0, err
    key = lambda r: (r["prompt_index"], r["sample"], r["completion"])  # noqa: E731
    assert [key(r) for r in rows] == sorted(map(key, read_jsonl(one)))  # written as finished
    again = torchrun(model_dir, out, "--resume")  # every row done: no rank loads a model
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to generate: all 6 rows are in" in again.stderr
    assert "loading main model" not in again.stderr and read_jsonl(out) == rows


def test_one_process_resumes_from_the_shards_a_stopped_run_left_and_replaces_them(
    model_dir, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "out.jsonl"
    args = f"generate --main {model_dir} {FLAGS} --no-progress -o {out}"
    rc, _, err = run(capsys, args, *PROMPTS)
    assert rc == 0, err
    # rows are written as they finish; a merge orders them by (prompt_index, sample)
    order = lambda line: (json.loads(line)["prompt_index"], json.loads(line)["sample"])  # noqa: E731
    whole = sorted(out.read_text().splitlines(keepends=True), key=order)
    expected = sorted(rows_of(out))
    # a stopped 4-rank run: rank 2 wrote rows 2-3, rank 0 rows 0-1, rank 4 row 5 (cut short)
    out.write_text("".join(whole[2:4]))
    out.with_name("out.jsonl.rank0").write_text("".join(whole[:2]))
    out.with_name("out.jsonl.rank4").write_text(whole[4] + whole[5][:20])

    import bass.cli.generate

    real_load = bass.cli.generate.load_models
    loads = []
    monkeypatch.setattr(
        bass.cli.generate, "load_models", lambda *a, **kw: loads.append(1) or real_load(*a, **kw)
    )
    rc, _, err = run(capsys, f"{args} --resume", *PROMPTS)
    assert rc == 0, err
    assert "5 of 6 rows are already in" in err and len(loads) == 1  # row 5 generated again
    assert out.read_text().startswith("".join(whole[:5]))
    assert rows_of(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]

    out.with_name("out.jsonl.rank1").write_text(whole[0])  # left by an earlier run
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    rc, _, err = run(capsys, args, *PROMPTS)  # neither --resume nor --overwrite: refused
    assert rc == 2 and one_error_line(err) == (
        f"bass: error: --output {out} (and 1 shard file(s)) already holds 7 line(s) of "
        "results: pass --resume to continue that run, or --overwrite to replace it (or "
        "choose another --output)"
    )
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before  # nothing touched
    rc, _, err = run(capsys, f"{args} --overwrite", *PROMPTS)  # replaced, shards too
    assert rc == 0, err
    assert sorted(rows_of(out)) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_merge_stopped_before_the_shards_were_removed_resumes(model_dir, tmp_path, capsys):
    """A merge killed between writing --output and removing the shards leaves rows in
    both: --resume keeps one copy of each (the same line), and refuses, changing nothing,
    where the two copies differ."""
    out = tmp_path / "out.jsonl"
    args = f"generate --main {model_dir} {FLAGS} --no-progress -o {out}"
    rc, _, err = run(capsys, args, *PROMPTS)
    assert rc == 0, err
    whole, expected = out.read_text(), rows_of(out)
    shard = out.with_name("out.jsonl.rank1")
    shard.write_text("".join(whole.splitlines(keepends=True)[3:]))  # rows already merged
    rc, _, err = run(capsys, f"{args} --resume", *PROMPTS)
    assert rc == 0, err
    assert rows_of(out) == expected and not shard.exists()

    row = json.loads(whole.splitlines()[3])
    shard.write_text(json.dumps({**row, "completion": "something else"}) + "\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    rc, _, err = run(capsys, f"{args} --resume", *PROMPTS)
    assert rc == 2, err
    line = one_error_line(err)
    assert f"prompt {row['prompt_index']}, sample {row['sample']} has two different rows" in line
    assert f"{shard}:1" in line
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before  # nothing touched


def test_a_merge_that_cannot_write_names_the_output_and_keeps_the_shards(tmp_path, capsys):
    """A full disk while the shards are merged: said naming --output (not an anonymous
    "open file"), the shards and --output as they were, the partial merge removed."""
    out, shard = tmp_path / "out.jsonl", tmp_path / "out.jsonl.rank1"
    out.write_text(stale_row(0) + "\n")
    shard.write_text(stale_row(1) + "\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    (tmp_path / "out.jsonl.merging").symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(OSError) as caught:
        scaleout.merge(out)
    assert caught.value.filename == str(out) and "--resume" in caught.value.strerror
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_a_merge_that_cannot_read_a_shard_names_the_shard(tmp_path, monkeypatch):
    """A device failing under a shard while the rows are copied: the error names that
    shard (not --output, which is fine), and no partial merge is left."""
    out, shard = tmp_path / "out.jsonl", tmp_path / "out.jsonl.rank1"
    out.write_text(stale_row(0) + "\n")
    shard.write_text(stale_row(1) + "\n")
    real = scaleout._read_at

    def failing(f, offset, length):
        if f.name == str(shard):
            raise OSError(errno.EIO, "Input/output error")
        return real(f, offset, length)

    monkeypatch.setattr(scaleout, "_read_at", failing)
    with pytest.raises(OSError) as caught:
        scaleout.merge(out)
    assert caught.value.filename == str(shard) and caught.value.errno == errno.EIO
    assert not (tmp_path / "out.jsonl.merging").exists() and out.read_text() == stale_row(0) + "\n"


class _TwoMachines(scaleout.Scaleout):
    """Rank ``rank`` of a 2-rank world whose collectives are played here: rank 1 lives on
    another machine, so it never sees the files rank 0 writes (``seen``: what it reports)."""

    def __init__(self, rank: int, seen: bool):
        super().__init__(Topology(2, rank, 1))
        self.seen, self.calls = seen, 0

    def _all_gather(self, value, group=None) -> list:
        self.calls += 1
        if self.calls == 1:  # shared((token, probe)): rank 0's, read from its directory
            return [value, (None, None)] if self.topo.is_main else [self.rank0, value]
        return [value, self.seen] if self.topo.is_main else [True, value]


@pytest.mark.parametrize("rank", [0, 1])
def test_ranks_that_do_not_see_rank_0s_directory_are_refused_on_every_rank(tmp_path, rank):
    """Ranks on several machines with --output in a directory local to each: rank 0 merges
    the shards it can see and every rank reads --output for --resume, so rows would be lost
    or generated twice; every rank refuses before any model loads, naming the blind ranks."""
    out = tmp_path / "out.jsonl"
    elsewhere = tmp_path / "other-machine"
    elsewhere.mkdir()
    if rank == 0:
        scale = _TwoMachines(0, seen=False)
    else:  # rank 1: rank 0's probe file is named in a directory it does not have
        scale = _TwoMachines(1, seen=False)
        scale.rank0 = ("token", elsewhere / "missing" / "out.jsonl.bass-check")
    with pytest.raises(UsageError, match=r"rank\(s\) 1 do not see the files rank 0 writes"):
        scale.check_shared(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-machine"]  # probe removed
    seeing = _TwoMachines(0, seen=True)
    seeing.check_shared(out)  # one directory for all: no error, nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-machine"]


def test_a_merge_that_misses_a_groups_rows_is_an_error_not_a_shorter_file(tmp_path, capsys):
    """After a data-parallel run, rank 0 prints the rows from the merged --output; fewer
    rows than the groups said they wrote (a shard it could not read) is refused, saying
    where the missing rows are."""
    out = tmp_path / "out.jsonl"
    out.write_text(stale_row(0) + "\n" + stale_row(2) + "\n")
    with pytest.raises(UsageError, match=r"wrote 3 rows, but only 1 were in the shards"):
        print_merged(out, done={(0, 0)}, n=1, expected=3)
    assert capsys.readouterr().out.count(">>> stale") == 1  # the row it has, printed


def test_a_data_parallel_run_writing_to_a_character_device_leaves_it_one(model_dir, tmp_path):
    """``-o /dev/null`` under torchrun: the merge of the shards replaced the device with a
    regular file (/dev/null itself, as root). A null device of the test's own stands in."""
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("creating a character device needs root")
    proc = torchrun(model_dir, null)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stat.S_ISCHR(null.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no shard, no lock
    assert proc.stdout.count(">>> hello world (sample 1/2)") == 1
    assert f"results             {null}" in proc.stdout


def test_a_resumed_run_shares_out_the_prompts_with_rows_left():
    """--resume on 2 groups with prompts 0-3 done: each group gets two of the four left (the
    group that had held the done prompts idled while the other generated the rest), every
    prompt's samples together, every row left exactly once."""
    rows = [(i, s) for i in range(8) for s in range(2)]
    done = {r for r in rows if r[0] < 4} | {(5, 0)}
    shares = [scaleout.Scaleout(Topology(2, rank, 1)).rows(rows, done) for rank in (0, 1)]
    assert shares == [[(4, 0), (4, 1), (5, 1)], [(6, 0), (6, 1), (7, 0), (7, 1)]]
    assert scaleout.Scaleout(Topology(1, 0, 1)).rows(rows, done) == sorted(set(rows) - done)


def test_ranks_that_read_other_prompts_or_settings_are_refused(monkeypatch):
    """Every rank reads its own --prompts-file (a file at one path on each machine): a rank
    whose prompts hash otherwise stops the job on every rank, naming it."""
    scale = scaleout.Scaleout(Topology(3, 0, 1))
    monkeypatch.setattr(scale, "every", lambda digest: [digest, digest, digest])
    scale.agree("prompts (--prompts-file p.txt)", ["hello", "the sea"])
    monkeypatch.setattr(scale, "every", lambda digest: [digest, digest, "another"])
    with pytest.raises(UsageError, match=r"^rank\(s\) 2 got other prompts \(--prompts-file p"):
        scale.agree("prompts (--prompts-file p.txt)", ["hello", "the sea"])
