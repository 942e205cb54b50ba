"""The procedural task: reproducibility, semantics (checked by an independent evaluator),
verifiability of every target solution, knob validation and text length."""

import ast
import itertools
import re

import pytest

from fp4rl.rl import tokenizer
from fp4rl.rl.task import VALID_OPERATOR_SETS, TaskConfig, evaluate, make_problem
from fp4rl.rl.verifier import reward

# The knob grid: every operator set x digits x (ops range, distractors, names, templates).
KNOB_GRID = [
    TaskConfig(min_ops=lo, max_ops=hi, digits=d, operators=ops, num_distractors=k,
               random_names=rn, templates=tpl, max_operands=mo)
    for ops in VALID_OPERATOR_SETS
    for d, (lo, hi), k, rn, tpl, mo in [
        (1, (1, 1), 0, False, ("What is {var}?",), 2),
        (2, (1, 3), 1, True, ("What is {var}?", "Find {var}.", "{var}=?"), 3),
        (3, (4, 8), 3, False, ("Compute {var}.",), 4),
    ]
]
PROBLEMS_PER_CONFIG = 30  # 12 configs x 30 = 360 problems


def _oracle_eval(expr: str, env: dict[str, int]) -> int:
    """Python's own integer arithmetic on the parsed expression: the independent oracle
    for precedence, floor division and modulo (and a zero divisor would raise here)."""
    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__,
           ast.FloorDiv: int.__floordiv__, ast.Mod: int.__mod__}

    def ev(node):
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        raise AssertionError(f"unexpected node {ast.dump(node)} in {expr!r}")

    return ev(ast.parse(expr, mode="eval").body)


def _check(p, cfg):
    statements = re.findall(r"([a-z])=([^.]+)\.", p.prompt)
    assert len(statements) == 1 + p.difficulty + cfg.num_distractors, p.prompt
    env = {}
    for name, expr in statements:
        assert name not in env, f"{name} bound twice in {p.prompt!r}"
        env[name] = _oracle_eval(expr, env)
        assert abs(env[name]) <= cfg.value_bound
    # The question (after the last statement) is one of the templates, asking for a name.
    question = p.prompt[p.prompt.rindex(". ") + 2:]
    asked = [m.group(1) for t in cfg.templates
             if (m := re.fullmatch(re.escape(t).replace(re.escape("{var}"), "([a-z])"), question))]
    assert len(asked) == 1, question
    assert env[asked[0]] == p.answer
    lines = p.solution.split("\n")
    assert len(lines) == p.difficulty + 1, p.solution
    assert lines[-1] == f"Answer: \\boxed{{{p.answer}}}"
    for line in lines[:-1]:  # "b=47*3-12=129": the substituted expression evaluates
        name, expr, value = line.split("=")
        assert _oracle_eval(expr, {}) == int(value) == env[name], line
    assert lines[-2].split("=")[0] == asked[0]  # the scratchpad ends on the asked variable
    assert reward(p.solution, p.answer) == 1.0
    tokenizer.encode(p.prompt + "\n" + p.solution)  # every character is in the vocabulary


@pytest.mark.parametrize("cfg", KNOB_GRID,
                         ids=lambda c: f"{c.operators}-d{c.digits}-ops{c.max_ops}")
def test_solutions_are_correct_and_verified(cfg):
    for i in range(PROBLEMS_PER_CONFIG):
        p = make_problem(i, 7, cfg)
        assert cfg.min_ops <= p.difficulty <= cfg.max_ops
        _check(p, cfg)


def test_every_knob_setting_is_exercised():
    # Guard against a grid that never produces some operator / distractor feature.
    seen = set()
    for cfg in KNOB_GRID:
        for i in range(PROBLEMS_PER_CONFIG):
            prompt = make_problem(i, 7, cfg).prompt
            seen |= {op for op in ("+", "-", "*", "//", "%") if op in prompt}
    assert seen == {"+", "-", "*", "//", "%"}


def test_pure_function_of_seed_and_index():
    cfg = TaskConfig(min_ops=1, max_ops=4, operators="+-*//%", num_distractors=2)
    forward = [make_problem(i, 3, cfg) for i in range(20)]
    backward = [make_problem(i, 3, cfg) for i in reversed(range(20))][::-1]
    assert forward == backward  # no hidden state between calls
    other_seed = [make_problem(i, 4, cfg) for i in range(20)]
    assert sum(a != b for a, b in zip(forward, other_seed)) >= 18
    assert len({p.prompt for p in forward}) == 20


def test_example_format():
    p = make_problem(0, 0, TaskConfig(min_ops=2, max_ops=2))
    pattern = r"a=\d+\. b=[a-z0-9+\-]+\. c=[a-z0-9+\-]+\. What is c\?"
    assert re.fullmatch(pattern, p.prompt), p.prompt
    assert p.solution.startswith("b=") and "\nc=" in p.solution


def test_easy_settings_are_short():
    # The tiny character-level model: prompt + solution of the easy band fits ~96-160 chars.
    lengths = [len(p.prompt) + 1 + len(p.solution)
               for p in (make_problem(i, 0, TaskConfig()) for i in range(300))]
    assert max(lengths) <= 100, max(lengths)
    hard = TaskConfig(min_ops=3, max_ops=3, operators="+-*//%", num_distractors=1)
    assert max(len(p.prompt) + 1 + len(p.solution)
               for p in (make_problem(i, 0, hard) for i in range(300))) <= 200


def test_evaluate_integer_semantics():
    # Python precedence and floor semantics, hand-computed.
    assert evaluate([47, 3, 12], ["*", "-"]) == 129
    assert evaluate([10, 7, 2], ["-", "//"]) == 7  # 10 - (7//2)
    assert evaluate([-7, 2], ["//"]) == -4
    assert evaluate([-7, 2], ["%"]) == 1
    assert evaluate([7, -2], ["%"]) == -1
    assert evaluate([5, 0], ["//"]) is None  # zero divisor: re-drawn by the generator
    assert evaluate([50, 50], ["*"], bound=999) is None
    for a, b in itertools.product(range(-6, 7), [-3, -2, 2, 5]):
        assert evaluate([a, b, 3], ["%", "*"]) == a % b * 3
        assert evaluate([a, b, 3], ["-", "//"]) == a - b // 3


@pytest.mark.parametrize("kwargs, match", [
    ({"operators": "+*"}, r"must be one of \('\+-', '\+-\*', '\+-\*//', '\+-\*//%'\)"),
    ({"min_ops": 3, "max_ops": 2}, "min_ops"),
    ({"min_ops": 0}, "min_ops"),
    ({"digits": 0}, "digits"),
    ({"max_operands": 1}, "max_operands"),
    ({"num_distractors": 30}, "single-letter"),
    ({"templates": ("What is it?",)}, "exactly once"),
    ({"templates": ()}, "templates"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(**kwargs)
