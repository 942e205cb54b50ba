"""Procedural integer-arithmetic task (docs/rl.md, "Task: verifiable integer arithmetic").

A problem is a chain of variable bindings, e.g.

    prompt:   a=47. b=a*3-12. c=b-a+5. What is c?
    solution: b=47*3-12=129
              c=129-47+5=87
              Answer: \\boxed{87}

`make_problem(index, seed, config)` is a pure function of its arguments: the random
generator is `numpy.random.default_rng([seed, index])`, so problem `i` can be regenerated
anywhere (resumable pipelines, held-out sets, debugging a single rollout) without replaying
the stream of earlier problems.

Integer semantics are Python's and are spelled out here because the model must learn them:
`*` `//` `%` bind tighter than `+` `-`, operators of one level associate to the left,
`//` is floor division and `%` has the sign of the divisor (`-7//2 == -4`, `-7%2 == 1`).
A divisor is never zero: a step whose divisor evaluates to 0 is re-drawn (and so is a
step whose value is 0, see `_draw_step`).

Difficulty knobs (`TaskConfig`): the number of operations (the main axis; one operation is
one derived binding, i.e. one scratchpad line), literal digits, the operator set, the number
of distractor bindings (defined in the prompt, never needed for the answer) and the question
templates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Operator levels follow docs/rl.md: "+,- then *, then //, %". "//" is one operator.
VALID_OPERATOR_SETS = ("+-", "+-*", "+-*//", "+-*//%")
_MULTIPLICATIVE = ("*", "//", "%")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Re-draws of one step before the fallback step is used (see `_draw_step`). Measured over
# the knob grid (1-3 digits, every operator set), at most ~41% of draws are rejected, so
# 64 tries essentially never run out; the fallback only guarantees termination.
_MAX_TRIES = 64


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs of the generator. Frozen and hashable (usable as a static arg).

    min_ops, max_ops: number of derived bindings (= scratchpad lines), drawn uniformly in
        [min_ops, max_ops] per problem; `Problem.difficulty` is the drawn value.
    digits: literals are drawn in [1, 10**digits - 1]; every intermediate value must stay
        within `value_bound` = 10**(digits+1) - 1 in absolute value, which keeps the texts
        short (a product of two 2-digit numbers is re-drawn unless it stays below 1000).
    operators: one of VALID_OPERATOR_SETS.
    max_operands: each step has between 2 and `max_operands` operands (1 or 2 operators
        for the default 3), e.g. `b=a*3-12` has 3.
    num_distractors: extra bindings interleaved in the prompt that the answer never uses.
    templates: question templates; each must contain "{var}" exactly once.
    random_names: draw variable names from the alphabet instead of a, b, c, ... in order.
    """

    min_ops: int = 1
    max_ops: int = 2
    digits: int = 2
    operators: str = "+-"
    max_operands: int = 3
    num_distractors: int = 0
    templates: tuple[str, ...] = ("What is {var}?",)
    random_names: bool = False

    def __post_init__(self):
        if self.operators not in VALID_OPERATOR_SETS:
            raise ValueError(
                f"{self.operators=} must be one of {VALID_OPERATOR_SETS} (docs/rl.md operator levels)"
            )
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= {self.min_ops=} <= {self.max_ops=}")
        if not 1 <= self.digits <= 6:
            raise ValueError(f"{self.digits=} must be in [1, 6]")
        if self.max_operands < 2:
            raise ValueError(f"{self.max_operands=} must be >= 2")
        if self.num_distractors < 0:
            raise ValueError(f"{self.num_distractors=} must be >= 0")
        if 1 + self.max_ops + self.num_distractors > len(_LETTERS):
            raise ValueError(
                f"1 + {self.max_ops=} + {self.num_distractors=} bindings exceed the "
                f"{len(_LETTERS)} single-letter variable names"
            )
        if not self.templates:
            raise ValueError(f"{self.templates=} must not be empty")
        for t in self.templates:
            if t.count("{var}") != 1:
                raise ValueError(f"template {t!r} must contain '{{var}}' exactly once")

    @property
    def operator_list(self) -> tuple[str, ...]:
        """The operator set as tokens: "+-*//%" -> ("+", "-", "*", "//", "%")."""
        return tuple(op for op in ("+", "-", "*", "//", "%") if op in self.operators)

    @property
    def value_bound(self) -> int:
        """Largest |value| allowed for any binding or partial result."""
        return 10 ** (self.digits + 1) - 1


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: str
    answer: int
    solution: str  # scratchpad lines then "Answer: \boxed{N}"
    difficulty: int  # number of operations (derived bindings on the answer's chain)


def evaluate(operands: list[int], operators: list[str], bound: int | None = None) -> int | None:
    """Evaluate `o0 op0 o1 op1 ...` with Python precedence and integer semantics.

    Returns None if a divisor is zero or (when `bound` is given) if any partial result
    exceeds `bound` in absolute value; the generator re-draws such steps.
    """
    if len(operands) != len(operators) + 1:
        raise ValueError(f"{len(operands)=} must be {len(operators)=} + 1")
    total, sign, term = 0, 1, operands[0]
    for op, x in zip(operators, operands[1:]):
        if op in _MULTIPLICATIVE:
            if op != "*" and x == 0:
                return None
            term = term * x if op == "*" else (term // x if op == "//" else term % x)
        else:
            total, sign, term = total + sign * term, (1 if op == "+" else -1), x
        if bound is not None and (abs(term) > bound or abs(total) > bound):
            return None
    total += sign * term
    if bound is not None and abs(total) > bound:
        return None
    return total


def _literal(rng: np.random.Generator, cfg: TaskConfig, divisor: bool) -> int:
    # Divisor literals start at 2: dividing by 1 teaches nothing, 0 is forbidden.
    return int(rng.integers(2 if divisor else 1, 10**cfg.digits))


def _draw_step(rng, cfg: TaskConfig, values: dict[str, int], pool: list[str], chain: str | None):
    """Draw one binding's expression as (operands, operators, value).

    An operand is ("var", name) or ("lit", int). `chain` (the previous binding on the
    answer's chain) must appear, so every main binding is needed for the answer; other
    variable operands come from `pool`. A distractor has `chain=None`.
    """
    ops = cfg.operator_list
    for _ in range(_MAX_TRIES):
        n = int(rng.integers(2, cfg.max_operands + 1))
        operators = [ops[int(k)] for k in rng.integers(0, len(ops), n - 1)]
        chain_pos = int(rng.integers(0, n)) if chain is not None else -1
        operands = []
        # A variable appears at most once per step: "a-a", "a%a", "a//a" are constants
        # that teach nothing.
        unused = [v for v in pool if v != chain]
        for j in range(n):
            divisor = j > 0 and operators[j - 1] in ("//", "%")
            if j == chain_pos:
                operands.append(("var", chain))
            elif unused and rng.random() < 0.5:
                operands.append(("var", unused.pop(int(rng.integers(0, len(unused))))))
            else:
                operands.append(("lit", _literal(rng, cfg, divisor)))
        nums = [values[x] if kind == "var" else x for kind, x in operands]
        value = evaluate(nums, operators, cfg.value_bound)
        # Zero is re-drawn too: once a binding is 0, products and quotients of it collapse
        # to 0 down the chain and the problem becomes trivial. (It also means a variable
        # divisor is never zero.)
        if value is not None and value != 0:
            return operands, operators, value
    # Fallback (termination guarantee): move the chain value towards zero by a literal,
    # which stays within the bound. A distractor falls back to a plain literal.
    lit = _literal(rng, cfg, divisor=False)
    if chain is None:
        return [("lit", lit)], [], lit
    op = "-" if values[chain] > 0 else "+"
    return [("var", chain), ("lit", lit)], [op], evaluate([values[chain], lit], [op])


def _render(operands, operators, fmt) -> str:
    out = fmt(operands[0])
    for op, x in zip(operators, operands[1:]):
        out += op + fmt(x)
    return out


def make_problem(index: int, seed: int, config: TaskConfig) -> Problem:
    """Problem number `index` of stream `seed`; a pure function of (index, seed, config)."""
    if index < 0 or seed < 0:
        raise ValueError(f"{index=} and {seed=} must be >= 0 (numpy SeedSequence entropy)")
    rng = np.random.default_rng([seed, index])
    cfg = config
    num_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
    # Binding order: the initial literal first, then main steps and distractors interleaved.
    kinds = ["main"] * num_ops + ["dist"] * cfg.num_distractors
    kinds = ["init"] + [kinds[int(k)] for k in rng.permutation(len(kinds))]
    if cfg.random_names:
        names = [_LETTERS[int(k)] for k in rng.permutation(len(_LETTERS))[: len(kinds)]]
    else:
        names = list(_LETTERS[: len(kinds)])

    values: dict[str, int] = {}
    main: list[str] = []  # answer-chain bindings so far
    defined: list[str] = []  # all bindings so far (distractors may use any)
    statements, scratch = [], []
    for kind, name in zip(kinds, names):
        if kind == "init":
            value = _literal(rng, cfg, divisor=False)
            operands, operators = [("lit", value)], []
        elif kind == "main":
            operands, operators, value = _draw_step(rng, cfg, values, main, main[-1])
        else:
            operands, operators, value = _draw_step(rng, cfg, values, defined, None)
        values[name] = value
        defined.append(name)
        if kind != "dist":
            main.append(name)
        statements.append(f"{name}={_render(operands, operators, lambda o: str(o[1]))}.")
        if kind == "main":
            # Substitute values; negatives in parentheses so "10-(-35)" stays readable.
            def sub(o):
                v = values[o[1]] if o[0] == "var" else o[1]
                return f"({v})" if v < 0 else str(v)

            scratch.append(f"{name}={_render(operands, operators, sub)}={value}")

    target = main[-1]
    template = cfg.templates[int(rng.integers(0, len(cfg.templates)))]
    prompt = " ".join(statements) + " " + template.replace("{var}", target)
    answer = values[target]
    solution = "\n".join(scratch + [f"Answer: \\boxed{{{answer}}}"])
    return Problem(prompt=prompt, answer=answer, solution=solution, difficulty=num_ops)


def noisy_solution(problem: Problem, index: int, seed: int, noise: float, max_offset: int = 9) -> str:
    """The worked solution with its final boxed answer replaced, with probability `noise`, by a
    wrong one: the answer plus a nonzero offset drawn uniformly from [-max_offset, max_offset].

    The "noisy teacher" warm-up: every scratchpad line stays correct, only the last step
    (copying the chain's value into the box) is unreliable. A model fit to such data puts about
    1 - noise of its probability on the right answer once its scratchpad is right, so sampled
    accuracy sits well inside RL's learnable band while greedy decoding is mostly right, and
    RL has a clear signal to learn: box the value the scratchpad computed. A pure function of
    (index, seed, noise), like `make_problem` (its own stream: `[seed, index, 1]`).
    """
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"answer noise={noise} must be in [0, 1]")
    if max_offset < 1:
        raise ValueError(f"{max_offset=} must be >= 1")
    rng = np.random.default_rng([seed, index, 1])
    if rng.random() >= noise:
        return problem.solution
    offset = int(rng.integers(1, max_offset + 1)) * (1 if rng.random() < 0.5 else -1)
    head = problem.solution.rsplit("\n", 1)[0] + "\n" if "\n" in problem.solution else ""
    return f"{head}Answer: \\boxed{{{problem.answer + offset}}}"
