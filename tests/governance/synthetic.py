"""A small HumanEval-like problem set and a seeded single-token AST mutator (test data only;
independent of the real suite in sandboxes/)."""
from __future__ import annotations

import ast
import random

PROBLEMS = {
    "has_close_elements": '''
def has_close_elements(numbers, threshold):
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True
    return False
''',
    "separate_paren_groups": '''
def separate_paren_groups(paren_string):
    result = []
    current_string = []
    current_depth = 0
    for c in paren_string:
        if c == '(':
            current_depth += 1
            current_string.append(c)
        elif c == ')':
            current_depth -= 1
            current_string.append(c)
            if current_depth == 0:
                result.append(''.join(current_string))
                current_string.clear()
    return result
''',
    "below_zero": '''
def below_zero(operations):
    balance = 0
    for op in operations:
        balance += op
        if balance < 0:
            return True
    return False
''',
    "mean_absolute_deviation": '''
def mean_absolute_deviation(numbers):
    mean = sum(numbers) / len(numbers)
    return sum(abs(x - mean) for x in numbers) / len(numbers)
''',
    "intersperse": '''
def intersperse(numbers, delimeter):
    if not numbers:
        return []
    result = []
    for n in numbers[:-1]:
        result.append(n)
        result.append(delimeter)
    result.append(numbers[-1])
    return result
''',
    "parse_nested_parens": '''
def parse_nested_parens(paren_string):
    def parse_paren_group(s):
        depth = 0
        max_depth = 0
        for c in s:
            if c == '(':
                depth += 1
                max_depth = max(depth, max_depth)
            else:
                depth -= 1
        return max_depth
    return [parse_paren_group(x) for x in paren_string.split(' ') if x]
''',
    "sum_product": '''
def sum_product(numbers):
    sum_value = 0
    prod_value = 1
    for n in numbers:
        sum_value += n
        prod_value *= n
    return sum_value, prod_value
''',
    "rolling_max": '''
def rolling_max(numbers):
    running_max = None
    result = []
    for n in numbers:
        if running_max is None:
            running_max = n
        else:
            running_max = max(running_max, n)
        result.append(running_max)
    return result
''',
    "is_palindrome_prefix": '''
def make_palindrome(string):
    if not string:
        return ''
    beginning_of_suffix = 0
    while string[beginning_of_suffix:] != string[beginning_of_suffix:][::-1]:
        beginning_of_suffix += 1
    return string + string[:beginning_of_suffix][::-1]
''',
    "string_xor": '''
def string_xor(a, b):
    def xor(i, j):
        if i == j:
            return '0'
        else:
            return '1'
    return ''.join(xor(x, y) for x, y in zip(a, b))
''',
    "longest": '''
def longest(strings):
    if not strings:
        return None
    maxlen = max(len(x) for x in strings)
    for s in strings:
        if len(s) == maxlen:
            return s
''',
    "greatest_common_divisor": '''
def greatest_common_divisor(a, b):
    while b:
        a, b = b, a % b
    return a
''',
}

_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult, ast.Mod: ast.Add,
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.And: ast.Or, ast.Or: ast.And,
}


def mutate(source: str, seed: int) -> tuple[str, str]:
    """One single-token mutation (operator swap, constant change, renamed variable, negated
    condition or off-by-one), chosen by `seed`. Returns (kind, mutated source)."""
    rng = random.Random(seed)
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    kinds = ["op", "const", "rename", "negate", "offbyone"]
    rng.shuffle(kinds)
    for kind in kinds:
        if kind == "op":
            cands = [n for n in nodes if isinstance(n, (ast.BinOp, ast.AugAssign, ast.BoolOp)) and type(n.op) in _SWAP]
            cands += [n for n in nodes if isinstance(n, ast.Compare) and type(n.ops[0]) in _SWAP]
            if cands:
                n = rng.choice(cands)
                if isinstance(n, ast.Compare):
                    n.ops[0] = _SWAP[type(n.ops[0])]()
                else:
                    n.op = _SWAP[type(n.op)]()
                break
        elif kind == "const":
            cands = [n for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, (int, str)) and not isinstance(n.value, bool)]
            if cands:
                n = rng.choice(cands)
                n.value = n.value + 1 if isinstance(n.value, int) else n.value + "x"
                break
        elif kind == "rename":
            names = sorted({n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
            if names:
                old = rng.choice(names)
                for n in nodes:
                    if isinstance(n, ast.Name) and n.id == old:
                        n.id = old + "_v"
                break
        elif kind == "negate":
            cands = [n for n in nodes if isinstance(n, (ast.If, ast.While))]
            if cands:
                n = rng.choice(cands)
                n.test = ast.UnaryOp(op=ast.Not(), operand=n.test)
                break
        elif kind == "offbyone":
            cands = [n for n in nodes if isinstance(n, ast.Return) and n.value is not None and isinstance(n.value, ast.Name)]
            if cands:
                n = rng.choice(cands)
                n.value = ast.BinOp(left=n.value, op=ast.Add(), right=ast.Constant(1))
                break
    return kind, ast.unparse(ast.fix_missing_locations(tree))


def mutant_tasks(n_mutants: int = 6, seed: int = 0) -> list[dict]:
    """Task rows like the repair suite's: task_id, repo, issue_id, issue, solution, slice."""
    rows = []
    for p_i, (name, src) in enumerate(sorted(PROBLEMS.items())):
        for m in range(n_mutants):
            kind, code = mutate(src, seed * 1000 + p_i * 100 + m)
            rows.append({
                "task_id": f"he-{name}-m{m}",
                "repo": f"humaneval/{name}",
                "issue_id": f"{name}#{m}",
                "issue": f"The function {name} is broken after a change ({kind}). "
                         f"Fix {name} so that its tests pass. " + " ".join(name.split("_")) * 3,
                "solution": code,
                "slice": kind,
            })
    return rows
