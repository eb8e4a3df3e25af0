"""bass on torch.distributed, on CPU with gloo and 2 ranks (torchrun subprocesses): a
tensor-parallel main model and a data-parallel job each give, on every rank, the output of
one process, token for token; ranks that disagree or fail end the job with an error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from models import perturbed, tiny_lm

import bass
from bass import distributed
from bass.batch_state import PromptError
from bass.models import load_config, load_tensor_parallel

WORKER = Path(__file__).with_name("distributed_worker.py")
PROMPTS = [[1, 2, 3, 1, 2, 3, 1], [4, 5], [6, 7, 8, 6, 7, 8], [9]]
EOS = 10  # greedy rows of this model end at new token 3, 4 and 11 (row 0: a stop sequence)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    main = tiny_lm(seed=3)  # 4 heads, 2 KV heads: tp 2 holds whole heads
    main.save_pretrained(root / "main")
    perturbed(main).save_pretrained(root / "draft")
    return root


def cases():
    sample = dict(max_new_tokens=10, do_sample=True, temperature=0.9, seed=5)
    return [
        dict(name="off", draft=None, generate=dict(max_new_tokens=10)),
        dict(name="ngram", draft="ngram", generate=dict(max_new_tokens=10)),
        dict(name="model", draft="model", generate=dict(max_new_tokens=10)),
        dict(
            name="adaptive-ngram",
            draft="ngram",
            policy="adaptive",
            generate=dict(max_new_tokens=10),
        ),
        dict(
            name="adaptive-model",
            draft="model",
            policy="adaptive",
            generate=dict(max_new_tokens=10),
        ),
        dict(name="sample-ngram", draft="ngram", policy="adaptive", generate=sample),
        dict(name="sample-off", draft=None, generate=sample),
        dict(
            name="eos-stops",
            draft="ngram",
            generate=dict(max_new_tokens=12, eos_token_id=EOS, stop_sequences=[[26, 51]]),
        ),
        dict(
            name="budget",
            draft="model",
            policy="adaptive",
            generate=dict(max_new_tokens=10, time_budget=600.0),
        ),
    ]


_REFERENCE: dict = {}


def one_process(dirs, case):
    """The case's result in this one process (computed once per module)."""
    key = (str(dirs), case["name"])
    if key not in _REFERENCE:
        _REFERENCE[key] = _one_process(dirs, case)
    return _REFERENCE[key]


def _one_process(dirs, case):
    main = bass.load_causal_lm(dirs / "main", dtype=torch.float64)
    draft = {
        "model": bass.load_causal_lm(dirs / "draft", dtype=torch.float64),
        "ngram": "ngram",
        None: None,
    }[case["draft"]]
    gen = bass.Generator(main, draft, policy=case.get("policy", "constant"), cpu_linear="torch")
    return gen.generate(PROMPTS, **case["generate"])


def launch(tmp_path, spec: dict, nproc: int = 2, timeout: float = 240):
    """Run the worker under torchrun; returns (exit code, output, {rank: results})."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "out"
    out.mkdir()
    here = Path(__file__).parent  # the worker, and tests/ (its helpers)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{here}{os.pathsep}{here.parent}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(WORKER), str(spec_path), str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return proc.returncode, proc.stdout + proc.stderr, results


def test_data_parallel_groups_finish_at_their_own_pace(dirs, tmp_path):
    """A group that finishes its share long before another (here: past the collectives'
    2-second timeout) waits for it at the job's end instead of timing out there."""
    case = dict(name="skewed", draft="ngram", policy="slow", prompts=PROMPTS,
                slow_rank=[1, 0.5], generate=dict(max_new_tokens=10))  # fmt: skip
    spec = dict(mode="dp", tp=1, main=str(dirs / "main"), draft=None, cases=[case], timeout=2)
    rc, output, results = launch(tmp_path, spec)
    assert rc == 0, output[-3000:]
    want = one_process(
        dirs, dict(name="skewed-reference", draft="ngram", generate=case["generate"])
    )
    assert results[0]["skewed"]["sequences"] == want.sequences, results[0]


@pytest.mark.parametrize("mode", ["tp", "dp"])
def test_two_ranks_equal_one_process(dirs, tmp_path, mode):
    """Every case on 2 ranks (TP: the main model sharded, the draft replicated; DP: the
    prompts sharded) equals one process token for token: drafting off, n-grams, a draft
    model, the default policy (timing-based: the leader's decisions are shared), seeded
    sampling, eos and stop sequences ending rows at different steps, a time budget."""
    spec = dict(mode=mode, tp=2 if mode == "tp" else 1, main=str(dirs / "main"),
                draft=str(dirs / "draft"), cases=cases(), timeout=60)  # fmt: skip
    for case in spec["cases"]:
        case["prompts"] = PROMPTS
    rc, output, results = launch(tmp_path, spec)
    assert rc == 0, output[-3000:]
    assert sorted(results) == [0, 1]
    for case in cases():
        want = one_process(dirs, case)
        got = results[0][case["name"]]
        assert "error" not in got, got
        assert got["sequences"] == want.sequences, case["name"]
        assert got["reasons"] == want.finish_reasons, case["name"]
        if mode == "tp":  # every rank of the group returns the same
            assert results[1][case["name"]] == got, case["name"]
        else:  # rank 0 holds everything, in order; each row says who generated it
            assert results[1][case["name"]] is None
            assert got["ranks"] == [0, 0, 1, 1]
    ends = {len(s) for s in results[0]["eos-stops"]["sequences"]}
    assert len(ends) > 1  # rows really finished at different steps


def test_data_parallel_api_takes_what_generate_takes(dirs, tmp_path):
    """``bass.distributed.generate`` with 1-D tensor prompts, a closure for ``on_finish``
    and ``row_ids`` (sampling keys): the rows (and log-probabilities) of one process's
    ``generate``, and each finished row named by its index among the whole call's
    prompts. (Tensors were refused as "different prompts" on the ranks, the closure failed
    to pickle, ``row_ids`` collided with the shard's own, and ``on_finish`` got shard-local
    indices.)"""
    gen_kw = dict(max_new_tokens=6, do_sample=True, seed=3, row_ids=[7, 5, 9, 1], logprobs=True,
                  prompt_logprobs=True)  # fmt: skip
    case = dict(name="api", draft="ngram", as_tensors=True, on_finish=True, prompts=PROMPTS,
                generate=gen_kw)  # fmt: skip
    spec = dict(mode="dp", tp=1, main=str(dirs / "main"), draft=None, cases=[case], timeout=60)
    rc, output, results = launch(tmp_path, spec)
    assert rc == 0, output[-3000:]
    want = one_process(dirs, dict(name="api-reference", draft="ngram", generate=gen_kw))
    got = results[0]["api"]
    assert "error" not in got, got
    assert got["sequences"] == want.sequences
    assert [len(lp) for lp in got["logprobs"]] == [len(s) for s in want.sequences]
    for theirs, ours in zip(got["logprobs"], want.logprobs, strict=True):  # each row's, in order
        assert theirs == pytest.approx(ours, abs=1e-9)
    for theirs, ours in zip(got["prompt_logprobs"], want.prompt_logprobs, strict=True):
        assert theirs[0] is ours[0] is None and theirs[1:] == pytest.approx(ours[1:], abs=1e-9)
    assert sorted(got["finished"]) == [0, 1] and sorted(results[1]["api"]["finished"]) == [2, 3]


def test_data_parallel_api_failures_reach_every_rank_without_a_hang(dirs, tmp_path):
    """``bass.distributed.generate`` without ``init()`` (it initialises the group: every
    rank generated every prompt), each rank catching what a call raises: a failure in rank
    1's share is rank 1's error there and a DistributedError naming it on rank 0 (rank 0
    waited for rank 1 at the job's end, for days); a bad argument is the same error on
    every rank (it was "ranks got different prompts and settings"); the next call runs."""
    fail = dict(name="fail", draft="ngram", policy="failing", fail_rank=1, prompts=PROMPTS,
                generate=dict(max_new_tokens=10))  # fmt: skip
    bad = dict(name="bad", draft=None, prompts=PROMPTS, generate=dict(max_new_tokens=4, top_p=2.0))
    ok = dict(name="ok", draft="ngram", prompts=PROMPTS, generate=dict(max_new_tokens=10))
    spec = dict(mode="dp", tp=1, main=str(dirs / "main"), draft=None, cases=[fail, bad, ok],
                no_init=True)  # fmt: skip
    start = time.monotonic()
    rc, output, results = launch(tmp_path, spec)
    assert rc == 0, output[-3000:]
    assert time.monotonic() - start < 200
    theirs = results[1]["fail"]["error"]
    assert theirs.startswith("PluginError: ") and "policy failure injected on rank 1" in theirs
    assert results[0]["fail"]["error"] == (
        f"DistributedError: 1 rank(s) failed their share of the job: rank 1: {theirs}"
    )
    assert results[0]["bad"] == results[1]["bad"]
    assert (
        results[0]["bad"]["error"].startswith("OptionError: ")
        and "top_p" in results[0]["bad"]["error"]
    )
    want = one_process(dirs, dict(name="ok-reference", draft="ngram", generate=ok["generate"]))
    assert results[0]["ok"]["sequences"] == want.sequences
    assert results[0]["ok"]["ranks"] == [0, 0, 1, 1] and results[1]["ok"] is None


def test_a_share_names_its_prompts_by_their_index_in_the_whole_call(dirs, monkeypatch):
    """One group's share (prompts 2 and 3 of 4, as rank 1 of 2 would get): a bad prompt's
    error and ``on_finish`` name the prompt by its index among the call's prompts, not the
    share's (they said "prompt 1" for prompt 3)."""
    monkeypatch.setattr(distributed, "shard", lambda n, topo=None: [2, 3])
    monkeypatch.setattr(
        distributed, "gather", lambda local, indices, n, topo=None, failed=None: None
    )
    gen = bass.Generator(bass.load_causal_lm(dirs / "main"), None, cpu_linear="torch")
    seen = []
    distributed.generate(gen, PROMPTS, max_new_tokens=2, on_finish=lambda r: seen.append(r.prompt))
    assert sorted(seen) == [2, 3]
    with pytest.raises(PromptError, match=r"^prompt 3 is empty") as info:
        distributed.generate(gen, [*PROMPTS[:3], []], max_new_tokens=2)
    assert info.value.prompt == 3


def test_tp_ranks_that_got_different_prompts_are_refused_on_every_rank(dirs, tmp_path):
    case = dict(name="differ", draft="ngram", generate=dict(max_new_tokens=4),
                prompts_by_rank={"0": [[1, 2, 3]], "1": [[1, 2, 4]]})  # fmt: skip
    spec = dict(mode="tp", tp=2, main=str(dirs / "main"), draft=None, cases=[case], timeout=60)
    rc, output, results = launch(tmp_path, spec)
    assert rc == 0, output[-3000:]
    for rank in (0, 1):
        error = results[rank]["differ"]["error"]
        assert "DistributedError" in error and "ranks [1] differ from rank 0" in error


def test_a_rank_that_fails_mid_generation_ends_the_job_with_its_error(dirs, tmp_path):
    case = dict(name="fail", draft="ngram", policy="failing", fail_rank=1, reraise=True,
                prompts=PROMPTS, generate=dict(max_new_tokens=10))  # fmt: skip
    spec = dict(mode="tp", tp=2, main=str(dirs / "main"), draft=None, cases=[case], timeout=30)
    start = time.monotonic()
    rc, output, _ = launch(tmp_path, spec)
    assert rc != 0
    assert "policy failure injected on rank 1" in output
    assert time.monotonic() - start < 120  # no hang: torchrun ends the other rank


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_before_loading(dirs):
    config = load_config(dirs / "main")  # 2 KV heads, 4 attention heads
    distributed.check_tp_size(config, 2)
    with pytest.raises(
        distributed.DistributedError, match=r"--tp 4 does not divide .* 2 key/value heads"
    ):
        distributed.check_tp_size(config, 4)
    with pytest.raises(distributed.DistributedError, match="--tp 3 does not divide"):
        distributed.check_tp_size(config, 3)


def test_a_family_transformers_cannot_shard_is_refused_before_loading(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_embd=32, n_layer=1, n_head=4).save_pretrained(tmp_path)  # no tp plan
    config = load_config(tmp_path)
    distributed.check_tp_size(config, 1)
    with pytest.raises(distributed.DistributedError, match=r"--tp 2: .*'gpt2'.* without --tp"):
        distributed.check_tp_size(config, 2)


def test_shards_are_contiguous_balanced_and_cover_every_prompt():
    for world, tp, n in [(2, 1, 5), (4, 2, 7), (3, 1, 2), (4, 1, 0)]:
        seen = []
        for rank in range(world):
            topo = distributed.Topology(world, rank, tp)
            part = distributed.shard(n, topo)
            group = range(topo.dp_rank * tp, (topo.dp_rank + 1) * tp)  # ranks g*tp .. g*tp+tp-1
            peers = [distributed.shard(n, distributed.Topology(world, r, tp)) for r in group]
            assert all(p == part for p in peers)  # a TP group shares its shard
            if topo.tp_rank == 0:
                seen += part
        assert seen == list(range(n))


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("nproc, tp", [(2, 1), (2, 2), (4, 2)], ids=["dp", "tp", "dp-x-tp"])
def test_torchrun_bass_generate_equals_one_process(tmp_path, capsys, nproc, tp):
    """``torchrun --nproc-per-node N -m bass generate ... [--tp T]``: the same rows, in the
    same order, with the same seeded samples as one process; each record names its rank;
    the completions and the summary are printed once (rank 0). With 4 ranks and ``--tp
    2``, two tensor-parallel groups each generate half the prompts."""
    from cli_support import read_jsonl, run, save_model_dir

    model = save_model_dir(tmp_path / "model")
    flags = (
        f"--main {model} --dtype float64 --samples 2 --sample --seed 3 --max-new-tokens 8 "
        "--batch-size 3 --no-progress"
    )
    prompts = ["hello world", "the sea is blue", "a cat", "hello"]
    rc, _, err = run(capsys, f"generate {flags} -o {tmp_path / 'one.jsonl'}", *prompts)
    assert rc == 0, err
    one = read_jsonl(tmp_path / "one.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "bass", "generate", *flags.split(), "--tp", str(tp),
           "-o", str(tmp_path / "two.jsonl"), *prompts]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = read_jsonl(tmp_path / "two.jsonl")
    key = [(r["prompt_index"], r["sample"]) for r in one]
    assert [(r["prompt_index"], r["sample"]) for r in two] == sorted(key)
    by_row = {(r["prompt_index"], r["sample"]): r["completion"] for r in one}
    assert [r["completion"] for r in two] == [by_row[k] for k in sorted(key)]
    assert {r["rank"] for r in two} == set(range(0, nproc, tp))  # each group's first rank
    assert proc.stdout.count("\nsummary") + proc.stdout.startswith("summary") == 1
    assert proc.stdout.count(">>> hello world (sample 1/2)") == 1
    assert not list(tmp_path.glob("two.jsonl.rank*"))  # shards merged and removed
    # the groups ran side by side: the summary's time is the slowest group's, not their sum
    shown = float(re.search(r"tokens generated +\d+ in ([\d.]+) s", proc.stdout).group(1))
    groups = re.search(r"times: the slowest group's, of (.*)\)", proc.stdout)
    if nproc // tp == 1:  # one group: its own time
        assert groups is None and shown > 0
        return
    per_group = [float(t) for t in re.findall(r"([\d.]+) s", groups.group(1))]
    assert len(per_group) == nproc // tp
    assert shown == pytest.approx(max(per_group), abs=0.011), (shown, per_group)


def test_torchrun_reads_standard_input_once(tmp_path, capsys):
    """``--prompts-file -`` under torchrun: rank 0 reads standard input and shares it (each
    rank read a part of the pipe: half the prompts were lost, exit 0)."""
    from cli_support import read_jsonl, run, save_model_dir

    model = save_model_dir(tmp_path / "model")
    prompts = [f"hello {w}" for w in ("world", "sea", "cat", "dog", "blue", "the")] * 3
    flags = f"--main {model} --max-new-tokens 3 --no-progress --prompts-file"
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    rc, _, err = run(capsys, f"generate {flags} {tmp_path / 'p.txt'} -o {tmp_path / 'one.jsonl'}")
    assert rc == 0, err
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "bass", "generate", *flags.split(), "-",
           "-o", str(tmp_path / "two.jsonl")]  # fmt: skip
    proc = subprocess.run(
        cmd, input="\n".join(prompts) + "\n", capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(tmp_path / "two.jsonl")
    assert len(one) == len(prompts) and [r["prompt"] for r in two] == prompts
    assert [r["completion"] for r in two] == [r["completion"] for r in one]
    assert {r["rank"] for r in two} == {0, 1}


def test_a_bad_prompt_in_another_groups_share_stops_every_rank_with_its_error(tmp_path):
    """A prompt too long for the model, in rank 1's share: every rank checks it before the
    first batch (rank 1 alone did, mid-job, and rank 0 then reported gloo's "Connection
    closed by peer" as an internal error, "a bug in bass")."""
    from cli_support import save_model_dir

    model = save_model_dir(tmp_path / "model")
    prompts = ["hello world", "a cat", "the sea", " ".join(["hello"] * 300)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "bass", "generate", "--main", model, "--max-new-tokens", "4", "--no-progress",
           *prompts]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("bass: error:")]
    # torchrun stops the other worker as soon as one exits with an error, so whether the
    # second rank gets to print its (identical) line first is a race: one or two lines.
    assert errors and all("exceeds the main model" in e for e in errors), proc.stderr[-3000:]
    assert "PROMPT argument 4" in errors[0]
    assert "a bug in bass" not in proc.stderr


def test_a_rank_that_lost_its_peer_says_so(monkeypatch, capsys):
    """A collective that failed because another rank went away is not "a bug in bass"."""
    from cli_support import one_error_line, run

    import bass.cli

    def lost(args):
        raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:48550")

    monkeypatch.setattr(bass.cli, "cmd_ops", lost)
    rc, _, err = run(capsys, "ops")
    assert rc == 1 and "a bug in bass" in err  # one process: a collective cannot fail so
    monkeypatch.setenv("WORLD_SIZE", "2")
    rc, _, err = run(capsys, "ops")
    assert rc == 1
    assert "another rank of this torchrun job stopped" in one_error_line(err)
    for message in (  # torch 2.13's: a build path; a restarted rank; a rank that never came
        "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error",
        "Gloo connectFullMesh failed with [...] no error",
        "Timed out waiting 600000ms for send operation to complete",
    ):

        def failed(args, m=message):
            raise RuntimeError(m)

        monkeypatch.setattr(bass.cli, "cmd_ops", failed)
        rc, _, err = run(capsys, "ops")
        assert "stopped or did not answer" in one_error_line(err) and "a bug" not in err, message


def test_tensor_parallelism_without_accelerate_says_what_to_install(monkeypatch, dirs):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real(name, *a),
    )
    with pytest.raises(distributed.DistributedError, match=r"pip install accelerate \("):
        load_tensor_parallel(dirs / "main", 2)
