"""A user's own drafter through the documented protocol (bass.drafters.Drafter): plugged
into a Generator directly or by entry-point name, and proven exact with bass.testing."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch
from models import tiny_lm

import bass
import bass.drafters
from bass import testing
from bass.drafters import Drafter, DrafterLoadError, Proposal


class RepeatDrafter(Drafter):
    """Deterministic: proposes the row's last token ``lengths[r]`` times (host tokens).
    Counts its calls to show the engine used it."""

    name = "repeat"

    def __init__(self):
        self.calls = 0
        self.commits = 0

    def start(self, state, passes, max_len, device):
        self.state = state
        return 0

    def propose(self, view, lengths):
        self.calls += 1
        last = [view.state.seqs[s][-1] for s in view.slots]
        return Proposal(drafted=list(lengths), host_tokens=[[t] * k for t, k in zip(last, lengths)])

    def commit(self, proposal, accepted):
        self.commits += 1


class UniformDrafter(Drafter):
    """Stochastic: samples each draft token uniformly (on the device) and returns the
    distributions it drew from, as a sampled draft model must."""

    name = "uniform"
    deterministic = False

    def __init__(self, vocab: int):
        self.vocab = vocab

    def propose(self, view, lengths):
        R, K = len(view.slots), max(lengths)
        probs = torch.full((R, K, self.vocab), 1.0 / self.vocab)
        tokens = torch.multinomial(probs.view(-1, self.vocab), 1, generator=view.generator)
        return Proposal(drafted=list(lengths), tokens=tokens.view(R, K), probs=probs)


PROMPTS = [[1, 2, 3, 1, 2], [4, 5], [7, 7, 7, 7]]


def test_a_deterministic_user_drafter_is_exact_greedy_and_sampled():
    main = tiny_lm(seed=3)
    drafter = RepeatDrafter()
    gen = bass.Generator(main, drafter, policy="constant", policy_options={"k": 3})
    res = testing.assert_greedy_equivalent(gen, PROMPTS, 12)
    assert drafter.calls > 0 and drafter.commits == drafter.calls
    assert sum(sum(s.drafted) for s in res.stats.steps) > 0
    testing.assert_sampled_equivalent(gen, PROMPTS, 12, seed=5)


def test_a_stochastic_user_drafter_keeps_the_distribution():
    """Coupled (the default): whatever it draws, verified against the keyed draws, so the
    very samples of plain decoding; rejection sampling: the distribution, not the draws."""
    V = 5
    main = tiny_lm("llama", vocab=V, sharpen=3.0)
    gen = bass.Generator(main, UniformDrafter(V), policy="constant", policy_options={"k": 2})
    testing.assert_sampled_equivalent(gen, [[1, 2], [3, 4, 1]], 6)
    kw = dict(policy="constant", policy_options={"k": 2}, draft_sampling="rejection")
    gen = bass.Generator(main, UniformDrafter(V), **kw)
    testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 4, rows=4000, seed=7)
    with pytest.raises(ValueError, match="rejection"):  # draw for draw: not promised
        testing.assert_sampled_equivalent(gen, [[1, 2]], 3)


class LateWrongDrafter(UniformDrafter):
    """Draws uniformly but reports it only for its first draft token; the later ones' q
    (what rejection sampling divides by) is wrong."""

    name = "late-wrong"

    def propose(self, view, lengths):
        proposal = super().propose(view, lengths)
        proposal.probs[:, 1:] = torch.tensor([0.6] + [0.4 / (self.vocab - 1)] * (self.vocab - 1))
        return proposal


def test_the_distribution_check_reaches_every_draft_position_it_says_it_tests():
    """A drafter wrong only past its first draft token: caught with room for its whole
    draft (max_new_tokens >= k + 2); with less, no step drafts past the first token, so the
    check passes, and warns that later positions went untested."""
    V = 5
    main = tiny_lm("llama", vocab=V, sharpen=3.0)
    kw = dict(policy="constant", policy_options={"k": 2}, draft_sampling="rejection")
    gen = bass.Generator(main, LateWrongDrafter(V), **kw)
    with pytest.raises(AssertionError, match="do not follow the main model's distribution"):
        testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 4, rows=4000, seed=7)
    with pytest.warns(UserWarning, match="draft tokens past position 1 were not tested"):
        testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 3, rows=4000, seed=7)


def test_the_distribution_check_catches_a_wrong_draft_position_among_many_outcomes():
    """k=3 and max_new_tokens=5: 3125 continuations, most expected under 5 times at 4000
    rows and pooled into one cell, where a wrong position hid (the whole continuations'
    test alone passed it); each position's test and each adjacent pair's catch it."""
    V = 5
    main = tiny_lm("llama", vocab=V, sharpen=3.0)
    kw = dict(policy="constant", policy_options={"k": 3}, draft_sampling="rejection")
    gen = bass.Generator(main, LateWrongDrafter(V), **kw)
    with pytest.raises(AssertionError, match=r"distribution: new tokens? [2-5]"):
        testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 5, rows=4000, seed=0)
    gen = bass.Generator(main, UniformDrafter(V), **kw)  # the lossless one passes
    test = testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 5, rows=4000, seed=0)
    assert test.df < 50  # (the continuations' test alone has little to go on)


def test_a_plugins_failing_finish_is_a_warning_not_a_lost_result():
    class Leaky(RepeatDrafter):
        def finish(self):
            raise RuntimeError("cannot let go")

    main = tiny_lm(seed=3)
    gen = bass.Generator(main, Leaky(), policy="constant", policy_options={"k": 2})
    with pytest.warns(RuntimeWarning, match=r"Leaky.* raised in finish\(\).*cannot let go"):
        res = gen.generate(PROMPTS, max_new_tokens=6)
    assert res.sequences == bass.Generator(main, None).generate(PROMPTS, max_new_tokens=6).sequences
    assert gen.cache is None  # the engine's own caches went all the same


def test_a_drafter_that_breaks_the_protocol_gets_a_clear_error():
    class Greedy(RepeatDrafter):
        def propose(self, view, lengths):  # one token more than allowed
            return Proposal(
                drafted=[k + 1 for k in lengths], host_tokens=[[1] * (k + 1) for k in lengths]
            )

    gen = bass.Generator(tiny_lm(), Greedy(), policy="constant", policy_options={"k": 2})
    with pytest.raises(
        ValueError, match=r"drafter .*Greedy, from module .* proposed .* within 0..its length"
    ):
        gen.generate(PROMPTS, max_new_tokens=4)

    class NoProbs(UniformDrafter):
        def propose(self, view, lengths):
            prop = super().propose(view, lengths)
            prop.probs = None
            return prop

    gen = bass.Generator(tiny_lm(), NoProbs(64), policy="constant", policy_options={"k": 2})
    gen.generate(PROMPTS, max_new_tokens=4)  # greedy needs no probs
    gen.generate(PROMPTS, max_new_tokens=4, do_sample=True, seed=0)  # nor coupled drafts
    kw = dict(policy="constant", policy_options={"k": 2}, draft_sampling="rejection")
    gen = bass.Generator(tiny_lm(), NoProbs(64), **kw)
    with pytest.raises(ValueError, match="returned no probs"):
        gen.generate(PROMPTS, max_new_tokens=4, do_sample=True, seed=0)

    class Bad(RepeatDrafter):  # proposals that would feed the model garbage
        def __init__(self, make):
            super().__init__()
            self.make = make

        def propose(self, view, lengths):
            return self.make(lengths)

    cases = [
        (lambda n: None, TypeError, "returned NoneType, expected a bass.hooks.Proposal"),
        (
            lambda n: Proposal(drafted=list(n), host_tokens=[[1.0] * k for k in n]),
            TypeError,
            "proposed 1.0: token ids are ints",
        ),
        (
            lambda n: Proposal(drafted=list(n), host_tokens=[[64] * k for k in n]),
            ValueError,
            r"token id 64, outside the vocabulary \[0, 64\)",
        ),
        (
            lambda n: Proposal(drafted=list(n), host_tokens=[[-1] * k for k in n]),
            ValueError,
            "token id -1",
        ),
        (
            lambda n: Proposal(drafted=list(n), tokens=torch.ones(len(n), max(n))),
            ValueError,
            r"tokens must be an integer tensor \[rows=3, >= 2\], got torch.float32",
        ),
        (
            lambda n: Proposal(drafted=list(n), tokens=torch.ones(len(n), 1, dtype=torch.long)),
            ValueError,
            "got torch.int64 \\[3, 1\\]",
        ),
        (  # the host ids would be verified, a device tensor that says otherwise ignored
            lambda n: Proposal(
                drafted=list(n),
                host_tokens=[[1] * k for k in n],
                tokens=torch.full((len(n), max(n)), 2),
            ),
            ValueError,
            "both tokens and host_tokens: give one",
        ),
    ]
    for make, error, match in cases:
        gen = bass.Generator(tiny_lm(), Bad(make), policy="constant", policy_options={"k": 2})
        with pytest.raises(error, match=match):
            gen.generate(PROMPTS, max_new_tokens=4)
    np_ids = Bad(lambda n: Proposal(drafted=list(n), host_tokens=[[np.int64(1)] * k for k in n]))
    gen = bass.Generator(tiny_lm(), np_ids, policy="constant", policy_options={"k": 2})
    testing.assert_greedy_equivalent(gen, PROMPTS, 4)  # numpy ints are ints

    class Lazy(Drafter):
        pass

    with pytest.raises(NotImplementedError, match="Lazy must implement propose"):
        bass.Generator(tiny_lm(), Lazy(), policy="constant").generate(PROMPTS, max_new_tokens=4)


def _fake_entry_points(monkeypatch, **targets):
    eps = [
        importlib.metadata.EntryPoint(name, value, bass.drafters.GROUP)
        for name, value in targets.items()
    ]
    monkeypatch.setattr(bass.drafters, "entry_points", lambda: eps)


def test_drafters_load_by_entry_point_name(monkeypatch):
    _fake_entry_points(
        monkeypatch,
        repeat="test_drafter_plugin:RepeatDrafter",
        broken="no_such_module_for_bass:Drafter",
        notone="collections:OrderedDict",
    )
    assert set(bass.drafters.available()) == {"broken", "ngram", "notone", "repeat"}
    gen = bass.Generator(tiny_lm(seed=3), "repeat", policy="constant")
    assert type(gen.drafter).__name__ == "RepeatDrafter"
    testing.assert_greedy_equivalent(gen, PROMPTS, 8)
    assert isinstance(bass.Generator(tiny_lm(), "ngram").drafter, bass.drafters.NGramDrafter)
    with pytest.raises(DrafterLoadError, match=r"drafter 'broken' .* failed to load") as err:
        bass.Generator(tiny_lm(), "broken")
    assert isinstance(err.value.__cause__, ModuleNotFoundError)
    with pytest.raises(DrafterLoadError, match=r"not a bass\.drafters\.Drafter"):
        bass.Generator(tiny_lm(), "notone")
    with pytest.raises(ValueError, match="unknown drafter 'nope'; installed: broken, ngram"):
        bass.Generator(tiny_lm(), "nope")


def test_the_installed_ngram_entry_point():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="bass.drafters")}
    assert eps.get("ngram") == "bass.drafters:NGramDrafter"
