"""``bass generate`` under ``torchrun``: which rows this rank generates, and where they
go (docs/guides/scale-out.md). Only rank 0 prints and holds the output's lock."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
from pathlib import Path

from .errors import UsageError, flag_error
from .results import Prompt, not_a_row

__all__ = ["Scaleout", "start"]


class Scaleout:
    """This process's part of a distributed ``bass generate`` (one process: ``world`` 1)."""

    def __init__(self, topo):
        self.topo = topo
        self.active = topo.world > 1
        self.sharded = topo.dp > 1  # several data-parallel groups: rows split, merged at the end
        self.prints = topo.is_main  # rank 0 only
        # rank 0, or each group's first rank (shards)
        self.writes = topo.is_main or (self.sharded and topo.tp_rank == 0)

    def rows(self, rows: list[tuple[int, int]], done: set) -> list[tuple[int, int]]:
        """The ``(prompt, sample)`` rows not ``done`` this rank's group generates: the
        prompts with rows left, shared out (a prompt's samples together), so that a
        resumed run's groups get equal shares of what is left."""
        todo = [r for r in rows if r not in done]
        if not self.sharded:
            return todo
        from .. import distributed

        left = list(dict.fromkeys(i for i, _ in todo))
        mine = {left[k] for k in distributed.shard(len(left), self.topo)}
        return [r for r in todo if r[0] in mine]

    def shard_path(self, out: Path, rank: int | None = None) -> Path:
        return out.with_name(f"{out.name}.rank{self.topo.rank if rank is None else rank}")

    def first(self, fn) -> None:
        """``fn()`` on rank 0 while every other rank waits; an error it raises ends every
        rank (a :class:`UsageError` with its own words), where the others would go on alone
        or wait for rank 0 forever."""
        error = None
        if self.topo.is_main:
            try:
                fn()
            except Exception as exc:  # shared before it is raised: no rank waits for rank 0
                error = exc
        if self.active:
            told = None if error is None else (isinstance(error, UsageError), str(error))
            said = self._all_gather(told)
            if error is None and said[0] is not None:
                usage, text = said[0]
                error = UsageError(text) if usage else RuntimeError(f"rank 0 failed: {text}")
        if error is not None:
            raise error

    def replace(self, out: Path) -> None:
        """Rank 0, when a run that does not resume starts writing: ``--output`` emptied and
        the shards of an earlier run removed, as one process replaces its file (this run's
        own shards are emptied by the ranks that write them)."""
        ours = {self.shard_path(out, r) for r in range(0, self.topo.world, self.topo.tp)}
        for path in shards(out):
            if not (self.sharded and path in ours):
                path.unlink(missing_ok=True)
        if self.sharded:  # rank 0 writes its shard; --output gets the merged rows at the end
            try:
                out.write_bytes(b"")
            except OSError as exc:
                raise UsageError(f"--output {out}: cannot write it: {exc.strerror}") from None

    def check_shared(self, out: Path) -> None:
        """Refuse, on every rank, a world whose ranks do not all see the files rank 0
        writes beside ``out``: each rank reads ``--output`` for ``--resume`` and rank 0
        merges the groups' shards, so a directory local to one node (ranks on several
        nodes) would lose rows or generate them twice. A file named at random, written by
        rank 0 and read back by every rank (no file system caches a name never looked up)."""
        if not self.active or (out.exists() and not out.is_file()):  # /dev/null: nothing
            return  # is written beside it
        probe = out.with_name(f"{out.name}.bass-check-{secrets.token_hex(6)}")
        token = None
        if self.topo.is_main:
            token = secrets.token_hex(8)
            try:
                probe.write_text(token)
            except OSError:
                token = None  # rank 0 cannot write there: refused below, on every rank
        token, probe = self.shared((token, probe))  # written before any rank reads it
        try:
            seen = token is not None and probe.read_text() == token
        except OSError:
            seen = False
        blind = [r for r, ok in enumerate(self.every(seen)) if not ok]
        if self.topo.is_main:
            probe.unlink(missing_ok=True)
        if token is None:
            raise UsageError(f"--output {out}: rank 0 cannot write beside it")
        if blind:
            raise UsageError(
                f"--output {out}: rank(s) {', '.join(map(str, blind))} do not see the files "
                "rank 0 writes in its directory (ranks on several machines, a directory "
                "local to one): put --output on a file system every machine shares"
            )

    def read_once(self, read, path: str | None) -> list[Prompt]:
        """``read()`` (the prompts) on every rank, or, when ``path`` is standard input or
        no regular file (a pipe, a FIFO: each rank would read a part of it), on rank 0
        alone and shared. A :class:`UsageError` any rank meets ends every rank, and so do
        ranks that read other prompts (:meth:`agree`)."""
        if not self.active:
            return read()
        alone = path == "-" or (
            path is not None and Path(path).exists() and not Path(path).is_file()
        )
        value, error = None, None
        if self.topo.is_main or not alone:
            try:
                value = read()
            except UsageError as exc:
                error = str(exc)
        if alone:  # rank 0's, as text and where it came from (a Prompt does not pickle)
            pairs = None if value is None else [(str(p), p.where) for p in value]
            error, pairs = self.shared((error, pairs))
            value = None if pairs is None else [Prompt(t, w) for t, w in pairs]
        else:
            said = [(r, e) for r, e in enumerate(self.every(error)) if e is not None]
            if said and error is None:  # another rank's (its file, on its machine)
                error = f"rank {said[0][0]}: {said[0][1]}"
        if error is not None:
            raise UsageError(error)
        if not alone:  # (rank 0's are every rank's)
            self.agree(
                f"prompts ({'--prompts-file ' + path if path else 'PROMPT arguments'})", value
            )
        return value

    def agree(self, what: str, value) -> None:
        """Every rank must hold an equal ``value`` (JSON, hashed), else every rank stops
        naming the ranks that differ from rank 0 (machines whose files at one path differ)."""
        if not self.active:
            return
        from .. import distributed

        seen = self.every(distributed.digest(value))
        differ = [r for r, d in enumerate(seen) if d != seen[0]]
        if differ:
            raise UsageError(
                f"rank(s) {', '.join(map(str, differ))} got other {what} than rank 0: every "
                "rank must run the same job (on several machines: the same files at the "
                "same paths)"
            )

    def every(self, value) -> list:
        """Every rank's ``value``, on every rank (a list in rank order)."""
        return self._all_gather(value) if self.active else [value]

    def shared(self, value):
        """Rank 0's ``value``, on every rank."""
        return self._all_gather(value)[0] if self.active else value

    def gather(self, value):
        """Every group's ``value`` on rank 0 (a list in rank order), ``None`` elsewhere: at
        the job's end, each group arriving when its share is done (no timeout for the
        slowest: ``bass.distributed.FINISH_TIMEOUT``)."""
        import torch.distributed as dist

        from .. import distributed

        parts: list | None = [None] * self.topo.world if self.topo.is_main else None
        dist.gather_object(value, parts, dst=0, group=distributed.control_group("finish"))
        if parts is None:  # only rank 0 receives them
            return None
        return [p for r, p in enumerate(parts) if r % self.topo.tp == 0]

    def _all_gather(self, value, group=None) -> list:
        """Every rank's ``value``, on every rank (a list in rank order), over the world's
        control group (or ``group``: ``"finish"``)."""
        import torch.distributed as dist

        from .. import distributed

        parts: list = [None] * self.topo.world
        ranks = group or range(self.topo.world)
        dist.all_gather_object(parts, value, group=distributed.control_group(ranks))
        return parts


def shards(out: Path) -> list[Path]:
    """The shard files of ``out`` on disk (``OUT.rank<r>``), this run's or an earlier
    run's with any number of ranks, by rank."""
    prefix = out.name + ".rank"
    found = [
        p for p in out.parent.glob(glob.escape(prefix) + "*") if p.name[len(prefix) :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(prefix) :]))


def check_files(out: Path) -> None:
    """Refuse shards of ``out`` that are not regular files (a directory named
    ``OUT.rank0``): a run could neither replace nor merge them."""
    odd = [p for p in shards(out) if not p.is_file()]
    if odd:
        raise UsageError(
            f"--output {out}: {odd[0]} is not a regular file, but the name of one of its "
            "shards (written by a data-parallel run): remove it or choose another --output"
        )


def check_unused(out: Path, resume: bool = True) -> None:
    """Refuse to start over on an ``--output`` that holds rows, its own or its shards'
    (an earlier run's finished work): ``--resume`` continues it (where the command has
    it), ``--overwrite`` replaces it. Blank lines are no rows."""
    held, rows = {}, True
    for p in [out, *shards(out)]:
        if p.is_file():
            try:
                with p.open("rb") as f:  # line by line: bounded memory
                    lines = (line for line in f if line.strip())
                    first = next(lines, None)
                    held[p] = (first is not None) + sum(1 for _ in lines)
                    rows = rows and (first is None or first.lstrip().startswith(b"{"))
            except OSError as exc:
                raise UsageError(f"--output {p}: cannot read it: {exc.strerror}") from None
    lines = sum(held.values())
    if lines and not rows:  # a README, a script: no run's rows
        raise UsageError(
            f"--output {out} holds {lines} line(s) that are no bass results (another file?): "
            "choose another --output, or pass --overwrite to replace it"
        )
    if lines:
        extra = sum(1 for p, n in held.items() if n and p != out)
        where = f"{out}" + (f" (and {extra} shard file(s))" if extra else "")
        how = "pass --resume to continue that run, or --overwrite" if resume else "pass --overwrite"
        raise UsageError(
            f"--output {where} already holds {lines} line(s) of results: {how} to replace it "
            "(or choose another --output)"
        )


def seed_in(out: Path) -> tuple[bool, int | None]:
    """``(True, seed)`` from the first row of ``out`` or its shards that records its
    settings (the seed a sampling run without ``--seed`` drew), else ``(False, None)``."""
    for path in [out, *shards(out)]:
        try:
            with path.open("rb") as f:  # up to the first row that records its settings
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict) and isinstance(row.get("settings"), dict):
                        return True, row["settings"].get("seed")
        except OSError:
            continue
    return False, None


def merge(out: Path) -> None:
    """Rank 0 (or one process resuming): every row of ``--output`` and of its shards, in
    prompt order, written back to ``--output`` (through a temporary file, then renamed);
    the shards removed. Memory: a few numbers per row (where each row's line lies), not
    the rows; each line is copied as it was written. A row in two files (a merge stopped
    between writing ``--output`` and removing the shards) is kept once where both lines
    are the same, and refused, before any file changes, where they differ."""
    parts = shards(out)
    if not parts:
        return
    files = [p for p in [out, *parts] if p.exists()]
    where = []  # (prompt_index, sample, file, offset, length) per row
    for i, path in enumerate(files):
        with path.open("rb") as f:
            offset = 0
            for number, line in enumerate(f, 1):
                at, offset = offset, offset + len(line)
                # a last line without its newline is a row cut short when a rank died
                # while writing it (that row is generated again)
                if not line.endswith(b"\n") or not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                keys = ("prompt_index", "sample")  # the rest is checked by read_done
                if not (isinstance(row, dict) and all(isinstance(row.get(k), int) for k in keys)):
                    raise not_a_row(f"{path}:{number}")
                where.append((row["prompt_index"], row["sample"], i, at, len(line), number))
    where.sort()
    tmp = out.with_name(out.name + ".merging")
    with contextlib.ExitStack() as stack:
        sources = [stack.enter_context(p.open("rb")) for p in files]

        def line(entry) -> bytes:
            try:
                return _read_at(sources[entry[2]], entry[3], entry[4])
            except OSError as exc:  # (a failing device): named by the file it reads
                raise OSError(exc.errno, exc.strerror or str(exc), str(files[entry[2]])) from exc

        kept = [where[0]] if where else []
        for entry in where[1:]:
            if entry[:2] != kept[-1][:2]:
                kept.append(entry)
            elif line(entry).rstrip() != line(kept[-1]).rstrip():
                a, b = (f"{files[e[2]]}:{e[5]}" for e in (kept[-1], entry))
                raise UsageError(
                    f"prompt {entry[0]}, sample {entry[1]} has two different rows, at {a} and "
                    f"{b}: remove one of them, then rerun with --resume"
                )
        try:
            with tmp.open("wb") as dest:
                for entry in kept:
                    dest.write(line(entry))
            os.replace(tmp, out)
        except OSError as exc:  # a full disk: said naming --output, the shards kept
            tmp.unlink(missing_ok=True)
            if exc.filename is not None and exc.filename not in (str(tmp), str(out)):
                raise  # reading a shard
            said = f"{exc.strerror or exc} (merging the ranks' rows into --output; the shards "
            raise OSError(exc.errno, said + "are kept: rerun with --resume)", str(out)) from exc
    for path in parts:
        path.unlink(missing_ok=True)


def _read_at(f, offset: int, length: int) -> bytes:
    f.seek(offset)
    return f.read(length)


def start(args) -> Scaleout:
    """The distributed setup ``args`` ask for: one process, or ``torchrun``'s world with
    ``--tp`` (initialised here, before any model loads)."""
    from .. import distributed

    tp = 1 if args.tp is None else args.tp
    if tp < 1:
        raise flag_error("--tp", tp, "an integer >= 1", "1, no tensor parallelism")
    if not distributed.launched():
        if tp > 1:
            raise UsageError(
                f"--tp {tp} shards the main model over {tp} processes: launch with "
                f"`torchrun --nproc-per-node {tp} -m bass generate ... --tp {tp}`"
            )
        return Scaleout(distributed.Topology(1, 0, 1))
    try:
        topo = distributed.init(tp=tp)
    except distributed.DistributedError as exc:
        raise UsageError(str(exc)) from exc
    return Scaleout(topo)
