"""What a drafter returns is checked before it is used, and a bad value is a
:class:`bass.errors.PluginOutputError` naming the drafter (``plugin``, ``hook``), never a
bare error from deep inside a pass nor silently wrong output: device tokens outside the
vocabulary (read in the step's one host read), counts of any integer type, the offer, the
probabilities' shape. A vocabulary resized between generations is read again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from models import reference_greedy, tiny_lm

import bass
from bass.drafters import Drafter, Offer, Proposal
from bass.errors import PluginOutputError

PROMPTS = [[1, 2, 3, 4], [5, 6]]


def _greedy(model, n=6):
    return [reference_greedy(model, p, n) for p in PROMPTS]


class DeviceTokens(Drafter):
    """Proposes ``token`` on the device at every drafted position (``drafted`` as
    ``kind`` makes it); padding past each row's count is ``pad``."""

    name = "device-tokens"

    def __init__(self, token=None, kind=list, pad=-7, dtype=torch.int32):
        self.token, self.kind, self.pad, self.dtype = token, kind, pad, dtype

    def propose(self, view, lengths):
        K = max(lengths)
        last = [view.state.seqs[s][-1] for s in view.slots]
        tokens = torch.full((len(lengths), K + 2), self.pad, dtype=self.dtype)
        for r, n in enumerate(lengths):
            tokens[r, :n] = last[r] if self.token is None else self.token
        return Proposal(drafted=self.kind(lengths), tokens=tokens)


@pytest.mark.parametrize("token", [64, -1, 10**6])
def test_device_tokens_outside_the_vocabulary_name_the_drafter(token):
    gen = bass.Generator(tiny_lm(), DeviceTokens(token), policy="constant")
    with pytest.raises(PluginOutputError, match=r"outside the vocabulary \[0, 64\)") as err:
        gen.generate(PROMPTS, max_new_tokens=4)
    assert err.value.plugin.startswith("drafter 'device-tokens' (DeviceTokens")
    assert err.value.hook == "propose"
    assert f"[{token}, {token}" in str(err.value)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16])
def test_device_tokens_of_a_narrow_type_outside_the_vocabulary_are_refused(dtype):
    """uint8 drafts of 255 with a vocabulary of 64: refused (the out-of-vocabulary mark,
    -1, wrapped to 255 in the drafts' own type, and 255 reached the output)."""
    gen = bass.Generator(tiny_lm(), DeviceTokens(255, pad=0, dtype=dtype), policy="constant")
    with pytest.raises(PluginOutputError, match=r"outside the vocabulary \[0, 64\)"):
        gen.generate(PROMPTS, max_new_tokens=4)
    model = tiny_lm()  # in the vocabulary, narrow types are fine
    gen = bass.Generator(model, DeviceTokens(pad=0, dtype=dtype), policy="constant")
    assert gen.generate(PROMPTS, max_new_tokens=6).sequences == _greedy(model)


@pytest.mark.parametrize(
    "kind", [list, tuple, np.array, torch.tensor, lambda ls: [np.int64(n) for n in ls]]
)
def test_counts_of_any_integer_type_are_taken(kind):
    model = tiny_lm()
    gen = bass.Generator(model, DeviceTokens(kind=kind), policy="constant")
    assert gen.generate(PROMPTS, max_new_tokens=6).sequences == _greedy(model)


@pytest.mark.parametrize("counts", [[1.0, 1.0], [True, True], None, [1]])
def test_counts_that_are_not_one_int_per_row_are_refused(counts):
    gen = bass.Generator(tiny_lm(), DeviceTokens(kind=lambda ls: counts), policy="constant")
    with pytest.raises(PluginOutputError, match=r"Proposal.drafted = .*one per active row"):
        gen.generate(PROMPTS, max_new_tokens=4)


class Offering(Drafter):
    name = "offering"

    def __init__(self, offer):
        self.made = offer

    def offer(self, view):
        return self.made(len(view.slots))

    def propose(self, view, lengths):
        return Proposal.none(view.slots)


@pytest.mark.parametrize(
    "offer, message",
    [
        (lambda R: [[1]] * R, "offer\\(\\) returned list"),
        (lambda R: Offer([[1]] * (R + 1), [1] * R), "one list of token ids per active row"),
        (lambda R: Offer([[1]] * R, None), "Offer.match_len = None"),
        (lambda R: Offer([[1]] * R, [-1] * R), "each must be >= 0"),
    ],
)
def test_a_bad_offer_is_the_drafters_error_not_the_policys(offer, message):
    gen = bass.Generator(tiny_lm(), Offering(offer))  # the default policy reads the offer
    with pytest.raises(PluginOutputError, match=message) as err:
        gen.generate(PROMPTS, max_new_tokens=4)
    assert err.value.plugin.startswith("drafter 'offering'") and err.value.hook == "offer"


class Sampling(Drafter):
    """Draws from the uniform distribution and reports ``probs`` of ``shape``."""

    name = "sampling"
    deterministic = False

    def __init__(self, width):
        self.width = width

    def propose(self, view, lengths):
        R, K = len(lengths), max(lengths)
        tokens = torch.randint(0, 64, (R, K), generator=view.generator)
        return Proposal(drafted=list(lengths), tokens=tokens, probs=torch.ones(R, K, self.width))


@pytest.mark.parametrize("width", [63, 65])
def test_probs_over_another_vocabulary_are_refused(width):
    gen = bass.Generator(tiny_lm(), Sampling(width), policy="constant", draft_sampling="rejection")
    with pytest.raises(
        PluginOutputError, match=r"probs must be a float tensor \[rows=2, >= \d, 64\]"
    ):
        gen.generate(PROMPTS, max_new_tokens=4, do_sample=True, seed=0)


def test_policy_output_errors_name_the_policy_and_hook():
    class Negative(bass.policies.Policy):
        def draft_length(self):
            return -1

        def update(self, record):
            pass

    gen = bass.Generator(tiny_lm(), "ngram", policy=Negative())
    with pytest.raises(PluginOutputError, match="a draft length must be an integer") as err:
        gen.generate(PROMPTS, max_new_tokens=4)
    assert err.value.plugin.startswith("policy (") and "Negative" in err.value.plugin
    assert err.value.hook == "draft_length"


def test_a_vocabulary_resized_after_the_generator_was_built_is_read_again():
    model = tiny_lm()
    gen = bass.Generator(model, "ngram")
    model.resize_token_embeddings(80)
    prompts = [[70, 71, 72, 70, 71, 72, 70], [5, 75, 6, 75, 5]]  # new ids, repeated: drafted
    want = [reference_greedy(model, p, 8) for p in prompts]
    assert gen.generate(prompts, max_new_tokens=8).sequences == want


@pytest.mark.parametrize(("which", "rows"), [("main", 80), ("main", 48), ("draft", 80)])
def test_a_draft_models_pair_resized_after_the_generator_was_built_is_refused(which, rows):
    """The draft model's drafter keeps the ids and widths it was made with: a bare
    IndexError in an embedding (or the draft's probabilities refused as its own bug)."""
    main = tiny_lm()
    draft = tiny_lm(seed=1)
    gen = bass.Generator(main, draft, policy="constant")
    (main if which == "main" else draft).resize_token_embeddings(rows, mean_resizing=False)
    with pytest.raises(ValueError, match=rf"the {which} model's vocabulary changed .* 64/64 -> "):
        gen.generate([[1, 2, 3]], max_new_tokens=4)


class Flagging(DeviceTokens):
    """Device drafts of the row's last token, with ``bad`` / ``confidence`` as made by
    ``extra(R, K)``."""

    name = "flagging"

    def __init__(self, extra):
        super().__init__()
        self.extra = extra

    def propose(self, view, lengths):
        prop = super().propose(view, lengths)
        for k, v in self.extra(len(lengths), max(lengths)).items():
            setattr(prop, k, v)
        return prop


@pytest.mark.parametrize(
    "extra",
    [
        lambda R, K: {"bad": torch.zeros(R + 1, dtype=torch.bool)},  # shifted the host read
        lambda R, K: {"bad": torch.zeros(R, 1, dtype=torch.bool)},
        lambda R, K: {"bad": [False] * R},
        lambda R, K: {"confidence": torch.ones(R)},
        lambda R, K: {"confidence": torch.ones(R, K - 1)},
        lambda R, K: {"confidence": torch.ones(R, K, dtype=torch.long)},
    ],
)
def test_bad_flags_and_confidences_of_the_wrong_shape_are_refused(extra):
    """``bad`` and ``confidence`` are read in the step's one host read, at fixed offsets:
    a ``bad`` one row too long shifted the drafts read after it (rows came back with
    wrong tokens, no error)."""
    gen = bass.Generator(tiny_lm(), Flagging(extra), policy="constant")
    with pytest.raises(PluginOutputError, match=r"Proposal\.(bad|confidence) must be None or"):
        gen.generate(PROMPTS, max_new_tokens=6)


def test_rows_a_drafter_flags_bad_name_the_drafter_and_right_shapes_are_taken():
    model = tiny_lm()
    fine = lambda R, K: {"bad": torch.zeros(R, dtype=torch.bool), "confidence": torch.ones(R, K)}  # noqa: E731
    gen = bass.Generator(model, Flagging(fine), policy="constant")
    assert gen.generate(PROMPTS, max_new_tokens=6).sequences == _greedy(model)
    flagged = Flagging(lambda R, K: {"bad": torch.ones(R, dtype=torch.bool)})
    gen = bass.Generator(model, flagged, policy="constant")
    with pytest.raises(RuntimeError, match=r"the draft model \(drafter 'flagging' .*non-finite"):
        gen.generate(PROMPTS, max_new_tokens=6)


class Counting(Drafter):
    """Drafts nothing; ``start`` and ``admit`` return ``got`` (the passes they ran)."""

    name = "counting"

    def __init__(self, hook, got):
        self.hook, self.got = hook, got

    def start(self, state, passes, max_len, device):
        return self.got if self.hook == "start" else 0

    def admit(self, state, slots):  # a reset per slot that forgot its `return 0`
        return self.got if self.hook == "admit" else 0

    def propose(self, view, lengths):
        return Proposal.none(view.slots)


@pytest.mark.parametrize("hook", ["start", "admit"])
@pytest.mark.parametrize("got", [None, -5, 1.5, True])
def test_passes_a_drafter_says_it_ran_must_be_a_count(hook, got):
    gen = bass.Generator(tiny_lm(), Counting(hook, got), policy="constant")
    with pytest.raises(PluginOutputError, match=rf"{hook}\(\) returned {got!r}: .* int >= 0") as e:
        gen.generate(PROMPTS, max_new_tokens=2)
    assert e.value.hook == hook and e.value.plugin.startswith("drafter 'counting'")


class LogProbs(Drafter):
    """Draws uniformly but reports another thing as ``probs``: log-probabilities (all
    negative: read as no mass), logits or scores over 1, inf, NaN for a token it never
    draws (every draft was rejected, unseen)."""

    name = "log-probs"
    deterministic = False

    def __init__(self, how=torch.log):
        self.how = how

    def propose(self, view, lengths):
        R, K, V = len(lengths), max(lengths), 64
        q = torch.full((R, K, V), 1.0 / (V - 1))
        q[..., -1] = 0  # the last token is never drawn
        tokens = torch.multinomial(q.view(-1, V), 1, generator=view.generator).view(R, K)
        return Proposal(drafted=list(lengths), tokens=tokens, probs=self.how(q))


def _nan_elsewhere(q):  # a probability for every drafted token, NaN for the last token
    return torch.cat([q[..., :-1], torch.full_like(q[..., -1:], torch.nan)], dim=-1)


@pytest.mark.parametrize(
    "how",
    [
        torch.log,
        lambda q: q * 100,
        lambda q: q * float("inf"),
        lambda q: q * torch.nan,
        _nan_elsewhere,
    ],
)
def test_probs_that_are_no_probability_for_a_drafted_token_are_refused(how):
    kw = dict(policy="constant", draft_sampling="rejection")
    gen = bass.Generator(tiny_lm(), LogProbs(how), **kw)
    said = r"no probability \(0 or less, over 1, or NaN\) for a token it drafted, or NaN"
    with pytest.raises(PluginOutputError, match=said) as err:
        gen.generate(PROMPTS, max_new_tokens=6, do_sample=True, seed=0)
    assert err.value.plugin.startswith("drafter 'log-probs'") and err.value.hook == "propose"
    assert "not log-probabilities" in str(err.value)
    # coupled sampling reads no probs: the same drafter is exact there
    gen = bass.Generator(tiny_lm(), LogProbs(how), policy="constant")
    assert len(gen.generate(PROMPTS, max_new_tokens=6, do_sample=True, seed=0).sequences) == 2


class Mutating(Drafter):
    """Proposes the row's newest token; changes row 0 (``how``) in ``hook``: what a
    drafter that extends a row in place to look ahead, and forgets to undo it, does."""

    name = "mutating"

    def __init__(self, hook, how):
        self.hook, self.how = hook, how

    def _change(self, state, s):
        seq = state.seqs[s]
        if self.how == "append":
            seq.append(5)
        elif self.how == "pop":
            seq.pop()
        elif self.how == "overwrite":
            seq[-1] = (seq[-1] + 1) % 64
        else:
            state.seqs[s] = list(seq)  # replaced by an equal copy: later appends go astray

    def offer(self, view):
        if self.hook == "offer":
            self._change(view.state, view.slots[0])

    def propose(self, view, lengths):
        if self.hook == "propose":
            self._change(view.state, view.slots[0])
        last = [[view.state.seqs[s][-1]] * n for s, n in zip(view.slots, lengths)]
        return Proposal(drafted=list(lengths), host_tokens=last, slots=list(view.slots))

    def start(self, state, passes, max_len, device):
        self.state = state
        return 0

    def commit(self, proposal, accepted):
        if self.hook == "commit":
            self._change(self.state, proposal.slots[0])


@pytest.mark.parametrize(
    "hook, how",
    [("propose", h) for h in ("append", "pop", "overwrite", "replace")]
    + [("offer", "append"), ("commit", "overwrite")],
)
def test_a_drafter_that_changes_a_row_is_refused_not_wrong_output(hook, how):
    """Before: every one of these ran to the end and returned rows that differ from the
    main model's greedy output (or crashed with an IndexError deep in the step)."""
    gen = bass.Generator(tiny_lm(), Mutating(hook, how), policy="constant")
    with pytest.raises(bass.errors.PluginError, match=rf"changed the engine's rows in {hook}\(\)"):
        gen.generate(PROMPTS, max_new_tokens=6)
    # the same drafter, leaving the rows as it found them: the main model's own output
    gen = bass.Generator(tiny_lm(), Mutating(None, how), policy="constant")
    assert gen.generate(PROMPTS, max_new_tokens=6).sequences == _greedy(tiny_lm())


class ArgmaxWithProbs(LogProbs):
    """Proposes a fixed token but reports the uniform distribution, while left at the
    ``Drafter`` default ``deterministic = True``."""

    name = "argmax-with-probs"
    deterministic = True

    def propose(self, view, lengths):
        R, K, V = len(lengths), max(lengths), 64
        return Proposal(drafted=list(lengths), tokens=torch.full((R, K), 3),
                        probs=torch.full((R, K, V), 1.0 / V))  # fmt: skip


def test_a_deterministic_drafter_that_returns_probs_is_refused_under_rejection_sampling():
    """Its drafts were rejection-sampled with the probs it reported, as if drawn from them:
    the rows' distribution was biased, silently. Greedy and coupled sampling read no probs."""
    gen = bass.Generator(tiny_lm(), ArgmaxWithProbs(), policy="constant",
                         draft_sampling="rejection")  # fmt: skip
    with pytest.raises(PluginOutputError, match=r"is deterministic .* but returned probs"):
        gen.generate(PROMPTS, max_new_tokens=6, do_sample=True, seed=0)
    assert len(gen.generate(PROMPTS, max_new_tokens=6).sequences) == 2
    coupled = bass.Generator(tiny_lm(), ArgmaxWithProbs(), policy="constant")
    assert len(coupled.generate(PROMPTS, max_new_tokens=6, do_sample=True, seed=0).sequences) == 2


class ZeroingLengths(DeviceTokens):
    """Proposes what it is allowed, then overwrites the lengths it was given."""

    def propose(self, view, lengths):
        proposal = super().propose(view, lengths)
        lengths[:] = [0] * len(lengths)
        return proposal


def test_a_drafter_writing_into_its_lengths_list_changes_nothing_the_engine_checks():
    """``propose`` gets its own copy of the policy's lengths: a drafter writing into it
    was checked against its own overwrite ("proposed [3, 3] tokens for rows allowed [0,
    0]"); the engine checks and records the policy's."""
    model = tiny_lm()
    gen = bass.Generator(model, ZeroingLengths(), policy="constant", policy_options={"k": 3})
    res = gen.generate(PROMPTS, max_new_tokens=6, do_sample=False)
    assert res.sequences == _greedy(model)
    assert res.stats.drafted_tokens > 0
