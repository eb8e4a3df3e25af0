"""Weights that change between two ``generate`` calls: the second call sees them, however
they changed (in place through ``.data``, under ``no_grad``, ``load_state_dict``, a new
Parameter), on a Generator built before the change and on a new one, with the CPU's packed
layouts in force (issue #32: ``w.data.copy_`` bypasses the version counter)."""

from __future__ import annotations

import copy

import pytest
import torch
from models import tiny_lm

from bass import Generator, cpu_linear
from bass.cpu_linear import LinearPlan, install
from bass.errors import UnsupportedModelError
from bass.testing import greedy_reference

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9]]


def _reference(model, prompts, n):
    return [greedy_reference(model, p, n) for p in prompts]


def _packed_everywhere(model):
    """Route every linear layer of ``model`` through the packed layout at every row count
    (what ``cpu_linear="auto"`` chooses for real models at verify-sized passes)."""
    shapes = {
        (m.weight.shape[0], m.weight.shape[1], m.weight.dtype)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    }
    install(model, LinearPlan({s: dict.fromkeys(range(1, 17), "packed") for s in shapes},
                              dict.fromkeys(shapes, "packed")))  # fmt: skip


def _changes():
    """Ways trainers change weights; each takes the model and a donor of new weights."""

    def data_copy(model, donor):
        for p, q in zip(model.parameters(), donor.parameters()):
            p.data.copy_(q.data)

    def data_ema(model, donor):  # an EMA update through .data
        for p, q in zip(model.parameters(), donor.parameters()):
            p.data.mul_(0.5).add_(q.data, alpha=0.5)

    def no_grad_inplace(model, donor):
        with torch.no_grad():
            for p, q in zip(model.parameters(), donor.parameters()):
                p.copy_(q)

    def load_state_dict(model, donor):
        model.load_state_dict(donor.state_dict())

    def data_assign(model, donor):  # .data rebound to another tensor
        for p, q in zip(model.parameters(), donor.parameters()):
            p.data = q.data.clone()

    def new_parameters(model, donor):
        for (name, _), q in zip(list(model.named_parameters()), donor.parameters()):
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, torch.nn.Parameter(q.detach().clone()))

    def one_element(model, donor):  # the smallest change there is, through .data
        w = model.get_output_embeddings().weight
        w.data[3, 5] = -w.data[3, 5] + 1.0

    def permuted_columns(model, donor):  # the same values, in another order within rows
        w = model.get_output_embeddings().weight
        w.data.copy_(w.data.flip(1))

    return [data_copy, data_ema, no_grad_inplace, load_state_dict, data_assign,
            new_parameters, one_element, permuted_columns]  # fmt: skip


CASES = [(change, None) for change in _changes()]
CASES += [(_changes()[1], "model"), (_changes()[6], "ngram")]  # .data EMA, one element


@pytest.mark.parametrize(("change", "draft"), CASES, ids=lambda v: getattr(v, "__name__", v))
def test_a_weight_change_between_calls_is_seen_by_the_next_call(change, draft):
    main = tiny_lm(dtype=torch.float32)
    _packed_everywhere(main)
    d = None
    if draft == "model":
        d = tiny_lm(dtype=torch.float32, seed=1)
        _packed_everywhere(d)
    elif draft == "ngram":
        d = "ngram"
    gen = Generator(main, d, policy="constant", policy_options={"k": 3})
    kw = dict(max_new_tokens=10)
    before = gen.generate(PROMPTS, **kw).sequences
    assert before == _reference(main, PROMPTS, 10)
    donor = tiny_lm(dtype=torch.float32, seed=7)
    change(main, donor)
    if isinstance(d, torch.nn.Module):
        change(d, tiny_lm(dtype=torch.float32, seed=8))
    fresh = copy.deepcopy(main)  # the changed weights, with no bass state on them
    cpu_linear.uninstall(fresh)
    want = _reference(fresh, PROMPTS, 10)
    assert want != before  # the change matters to the output
    assert gen.generate(PROMPTS, **kw).sequences == want  # the Generator built before
    again = Generator(main, d, policy="constant", policy_options={"k": 3})
    assert again.generate(PROMPTS, **kw).sequences == want  # and a new one


def test_a_generator_checks_the_packed_copies_another_one_installed():
    """Two Generators of one model: the last one's routing is the model's, so the first
    (built without packed copies) runs through the other's: a weight synced through
    ``.data`` (no version bump) must be found by either (it was skipped: stale weights)."""
    main = tiny_lm(dtype=torch.float32)
    first = Generator(main, "ngram", cpu_linear="unpacked")
    _packed_everywhere(main)  # what a second Generator, cpu_linear="auto", may install
    before = first.generate(PROMPTS, max_new_tokens=10).sequences
    assert before == _reference(main, PROMPTS, 10)
    with torch.no_grad():
        main.lm_head.weight.data.neg_()
    res = first.generate(PROMPTS, max_new_tokens=10)
    assert res.sequences == _reference(main, PROMPTS, 10) != before  # the new weights'
    assert res.stats.backend["repacked"] == 1 and res.stats.backend["packed_copies_mib"] > 0
    cpu_linear.uninstall(main)


def test_a_routed_model_pickles_and_its_copy_computes_the_same(tmp_path):
    """``torch.save(model)`` of a model a Generator routed wrote a file that did not load
    (the routed forward was a bound method of a function nn.Linear does not have)."""
    import pickle

    main = tiny_lm(dtype=torch.float32)
    _packed_everywhere(main)
    torch.save(main, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = torch.tensor([PROMPTS[0]])
    for twin in (pickle.loads(pickle.dumps(main)), loaded):
        with torch.no_grad():
            assert torch.equal(twin(x).logits, main(x).logits)
        assert Generator(twin, "ngram").generate(PROMPTS, max_new_tokens=10).sequences == (
            _reference(main, PROMPTS, 10)
        )
    cpu_linear.uninstall(main)


def _eager_backend(gm, example_inputs):  # Dynamo's graphs, run as traced: fast to "compile"
    return gm.forward


def test_a_changed_config_float_is_compiled_again():
    """A compiled graph holds the floats its forward reads as constants (compat shim 11),
    the config's too: Gemma 2 reads ``config.final_logit_softcapping`` in its forward. A
    change between generations compiles the model again (with the warning), so its rows
    stay the eager ones (they were the old cap's, silently, with module guards skipped)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=None,
        final_logit_softcapping=30.0, layer_types=["full_attention"] * 2,
    )  # fmt: skip
    model = Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # logits large enough for the cap to matter
    torch._dynamo.reset()
    compiled = Generator(model, compile=_eager_backend, policy="constant", policy_options={"k": 0})
    before = compiled.generate(PROMPTS, max_new_tokens=8).sequences
    assert before == _reference(model, PROMPTS, 8)
    model.config.final_logit_softcapping = 0.05
    with pytest.warns(UserWarning, match="float settings"):
        after = compiled.generate(PROMPTS, max_new_tokens=8).sequences
    assert after == _reference(model, PROMPTS, 8) and after != before
    torch._dynamo.reset()


def test_attributes_a_forward_sets_do_not_recompile_every_generation():
    """Some modules set attributes in their forward (dynamic RoPE's ``max_seq_len_cached``):
    the check between generations reads floats only, so an int a forward moves does not
    compile the model again at every generation (the warning is an error in these tests)."""
    model = tiny_lm("llama", dtype=torch.float32)
    norm = model.model.norm
    norm.calls = 0
    plain = type(norm).forward

    def counting(self, hidden):
        self.calls += 1  # an int, replayed by Dynamo after each compiled pass
        return plain(self, hidden)

    norm.forward = counting.__get__(norm)
    torch._dynamo.reset()
    gen = Generator(model, compile=_eager_backend, policy="constant", policy_options={"k": 0})
    first = gen.generate(PROMPTS, max_new_tokens=6).sequences
    assert norm.calls > 0  # the region was made before the forward moved it
    assert gen.generate(PROMPTS, max_new_tokens=6).sequences == first
    torch._dynamo.reset()


def test_a_model_switched_to_eval_after_compiling_in_training_mode_is_compiled_again():
    """A graph traced in training mode draws dropout (GPT-2's residual and embedding
    dropout), and the region's guards skip the modules' ``training`` flags: after
    ``model.eval()`` its greedy rows were still drawn with dropout, silently. The mode is
    part of what the check between generations compares."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.5,
        embd_pdrop=0.5, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg).train()
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
    torch._dynamo.reset()
    gen = Generator(model, compile=_eager_backend, policy="constant", policy_options={"k": 0})
    gen.generate(PROMPTS, max_new_tokens=8, eos_token_id=None)  # traced in training mode
    model.eval()
    with pytest.warns(UserWarning, match="training mode"):
        after = gen.generate(PROMPTS, max_new_tokens=8, eos_token_id=None).sequences
    assert after == _reference(model.eval(), PROMPTS, 8)
    torch._dynamo.reset()


def test_a_weight_replaced_in_a_stream_by_a_tensor_at_its_address_is_packed_again():
    """A new weight tensor may take the address the replaced one had, at the same version
    (0): ``load_state_dict(assign=True)`` twice in a stream's loop body did, most rows. The
    on-the-spot check compared address and version only, and the rows admitted after ran on
    the old packed copy, silently. It compares which tensor was packed too."""
    main = tiny_lm(dtype=torch.float32)
    head, got = main.lm_head, {}
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # as loaded: version 0
    _packed_everywhere(main)
    gen = Generator(main, None)
    for row in gen.stream(PROMPTS[:2], max_new_tokens=6, max_rows=1):
        got[row.prompt] = row.tokens
        if row.prompt == 0:  # new values in a new tensor at the old one's address, version 0
            with torch.no_grad():
                head.weight.data.neg_()  # (.data: unseen by the version counter)
            head.weight = torch.nn.Parameter(head.weight.data)
    assert head.weight._version == 0
    assert got[1] == _reference(main, PROMPTS[1:2], 6)[0]
    cpu_linear.uninstall(main)


def test_generation_under_autocast_follows_it_on_every_layout():
    """oneDNN's packed op has no autocast rule (F.linear has): under ``torch.autocast`` the
    packed layers computed in float32 while the others computed in bf16, so the rows
    depended on the layout each pass took. Under autocast every layer takes F.linear (the
    rows equal torch's layout's). A float32 model's compiled passes cannot run under bf16
    autocast: the error says autocast (it said "could not compile the model"); a bf16
    model's can."""
    main = tiny_lm(dtype=torch.float32, hidden=128, vocab=1024, sharpen=1.0)
    plain = copy.deepcopy(main)
    _packed_everywhere(main)
    torch_layout = Generator(plain, None, cpu_linear="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch_layout.generate(PROMPTS, max_new_tokens=16).sequences
        assert Generator(main, None).generate(PROMPTS, max_new_tokens=16).sequences == want
        compiled = Generator(main, None, compile=_eager_backend)
        with pytest.raises(UnsupportedModelError, match=r"forward under torch\.autocast"):
            compiled.generate(PROMPTS, max_new_tokens=8)
    assert torch_layout.generate(PROMPTS, max_new_tokens=16).sequences != want  # it mattered
    cpu_linear.uninstall(main)
    half = tiny_lm(dtype=torch.bfloat16)
    compiled = Generator(half, None, compile=_eager_backend)
    want = compiled.generate(PROMPTS, max_new_tokens=6).sequences
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled.generate(PROMPTS, max_new_tokens=6).sequences == want
