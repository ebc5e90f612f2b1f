"""Has the base model seen these programs? A membership test by Min-K% token probability.

    report = contamination_report(scorer, held_out_programs, control_programs)
    report["excess_gap"]     # how much more the names matter on the held-out set than on the control

A public pretrained model has probably read HumanEval's solutions. Min-K% (Shi et al., 2023): the
mean log-probability of the k% least likely tokens of a text is high for a text the model was
trained on (no token surprises it) and lower for an unseen one. On code, a memorised program is
memorised with its identifiers, so each program is compared with itself with every identifier it
defines renamed (`rename_identifiers`: same structure, same formatting, neutral names): the
per-program gap Min-K%(as written) - Min-K%(renamed) is large when the model remembers the
program, small when it merely reads code well. Renaming costs likelihood even on unseen code, so
the gap on the held-out programs is judged against the same gap on CONTROL programs the model
cannot have seen (written for this test after the model's release): `excess_gap` = held-out mean
gap - control mean gap, with a bootstrap 95% CI. A CI above 0 says the held-out set is likely in
the model's pretraining data: a result on it measures recall as well as repair.
"""
from __future__ import annotations

import ast
import builtins
from collections.abc import Sequence

MIN_K = 0.2

# Programs written for this test (2026), after the base model's release: the base cannot have
# trained on them. HumanEval-sized functions with ordinary names, as a repair task would hold.
CONTROL_PROGRAMS = (
    "def longest_plateau(values):\n    best = 0\n    run = 0\n    previous = None\n    for value in values:\n"
    "        if value == previous:\n            run += 1\n        else:\n            run = 1\n"
    "        previous = value\n        best = max(best, run)\n    return best\n",
    "def merge_ranges(ranges):\n    ordered = sorted(ranges)\n    merged = []\n    for start, end in ordered:\n"
    "        if merged and start <= merged[-1][1]:\n            merged[-1][1] = max(merged[-1][1], end)\n"
    "        else:\n            merged.append([start, end])\n    return [tuple(pair) for pair in merged]\n",
    "def digit_histogram(number):\n    counts = [0] * 10\n    for char in str(abs(number)):\n"
    "        counts[int(char)] += 1\n    return counts\n",
    "def rotate_words(sentence, shift):\n    words = sentence.split()\n    if not words:\n        return ''\n"
    "    shift %= len(words)\n    return ' '.join(words[-shift:] + words[:-shift])\n",
    "def balance_after(transactions, limit):\n    balance = 0\n    for amount in transactions:\n"
    "        if balance + amount < -limit:\n            continue\n        balance += amount\n    return balance\n",
    "def first_repeated_pair(items):\n    seen = set()\n    for left, right in zip(items, items[1:]):\n"
    "        key = (left, right)\n        if key in seen:\n            return key\n        seen.add(key)\n"
    "    return None\n",
    "def scale_to_unit(samples):\n    low = min(samples)\n    high = max(samples)\n    if high == low:\n"
    "        return [0.0 for _ in samples]\n    return [(sample - low) / (high - low) for sample in samples]\n",
    "def count_vowel_runs(text):\n    runs = 0\n    inside = False\n    for char in text.lower():\n"
    "        vowel = char in 'aeiou'\n        if vowel and not inside:\n            runs += 1\n"
    "        inside = vowel\n    return runs\n",
    "def pad_groups(code, size):\n    groups = []\n    for index in range(0, len(code), size):\n"
    "        chunk = code[index:index + size]\n        groups.append(chunk.ljust(size, '-'))\n"
    "    return '/'.join(groups)\n",
    "def nearest_multiple(value, base):\n    lower = (value // base) * base\n    upper = lower + base\n"
    "    if value - lower < upper - value:\n        return lower\n    return upper\n",
    "def alternate_sum(numbers):\n    total = 0\n    sign = 1\n    for number in numbers:\n"
    "        total += sign * number\n        sign = -sign\n    return total\n",
    "def split_even_odd(values):\n    evens = [value for value in values if value % 2 == 0]\n"
    "    odds = [value for value in values if value % 2 != 0]\n    return evens, odds\n",
)


def _tree(code: str) -> ast.Module:
    """The program without docstrings: a docstring names the function in its examples, which a
    renamed program would contradict (a gap from inconsistency, not from memory)."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def rename_identifiers(code: str) -> str:
    """`code` with every name it defines (functions, arguments, assigned names, loop and
    comprehension targets) renamed to a neutral one (v0, v1, ... and f0, f1, ...), re-printed by
    `ast.unparse` without docstrings; builtins, imports and attributes keep their names. Compare it
    with `normalise(code)`, the same printer over the original names, so only the names differ."""
    tree = _tree(code)
    defined: dict[str, str] = {}
    keep = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep |= {(a.asname or a.name).split(".")[0] for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in keep:
            defined.setdefault(node.name, f"f{sum(v.startswith('f') for v in defined.values())}")
    for node in ast.walk(tree):
        name = node.arg if isinstance(node, ast.arg) else \
            node.id if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else None
        if name and name not in keep and name not in defined:
            defined[name] = f"v{sum(v.startswith('v') for v in defined.values())}"

    class _Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = defined.get(node.id, node.id)
            return node

        def visit_arg(self, node):
            node.arg = defined.get(node.arg, node.arg)
            return node

        def visit_FunctionDef(self, node):
            node.name = defined.get(node.name, node.name)
            self.generic_visit(node)
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

    return ast.unparse(_Rename().visit(tree)) + "\n"


def normalise(code: str) -> str:
    return ast.unparse(_tree(code)) + "\n"


def min_k(logprobs: Sequence[float], k: float = MIN_K) -> float:
    """Mean of the lowest `k` fraction of the token log-probabilities (at least one token)."""
    if not logprobs:
        raise ValueError("no tokens to score")
    low = sorted(logprobs)[:max(1, int(len(logprobs) * k))]
    return sum(low) / len(low)


def name_gaps(scorer, programs: Sequence[str], k: float = MIN_K) -> list[float]:
    """Min-K%(as written) - Min-K%(renamed) per program (both through the same printer)."""
    return [min_k(scorer.token_logprobs(normalise(p)), k) - min_k(scorer.token_logprobs(rename_identifiers(p)), k)
            for p in programs]


def reference_program(bundle) -> str | None:
    """A repair task's reference solution: the faulty file with the recorded fix applied
    (`metadata["fix"]`: file, line, col, end_col, old, new), or None when the task records none."""
    fix = (getattr(bundle, "metadata", None) or {}).get("fix")
    if not isinstance(fix, dict) or fix.get("file") not in (bundle.files or {}):
        return None
    lines = bundle.files[fix["file"]].splitlines(keepends=True)
    if not 1 <= fix["line"] <= len(lines):
        return None
    text = lines[fix["line"] - 1]
    if text[fix["col"]:fix["end_col"]] != fix["old"]:
        return None
    lines[fix["line"] - 1] = text[:fix["col"]] + fix["new"] + text[fix["end_col"]:]
    return "".join(lines)


def contamination_report(scorer, programs: Sequence[str], control: Sequence[str] = CONTROL_PROGRAMS, *,
                         k: float = MIN_K, seed: int = 0) -> dict:
    """The held-out set's name gap against the control's (module doc), with a bootstrap CI."""
    from ratchet.evaluation.stats import bootstrap_diff_ci

    held, ctl = name_gaps(scorer, programs, k), name_gaps(scorer, control, k)
    if not held or not ctl:
        raise ValueError("need at least one held-out and one control program")
    ci = bootstrap_diff_ci(held, ctl, seed=seed)
    return {"min_k": k, "programs": len(held), "control_programs": len(ctl),
            "held_out_gap": round(sum(held) / len(held), 4), "control_gap": round(sum(ctl) / len(ctl), 4),
            "excess_gap": round(ci.estimate, 4), "excess_gap_ci": [round(ci.lo, 4), round(ci.hi, 4)],
            "likely_seen": ci.lo > 0}
