"""The two small languages a study file may hold: `claims:` and the `failure:` rule.

Both are parsed by a hand-written tokenizer and recursive-descent parser into frozen dataclasses. Nothing
is ever `eval`'d: a claim or rule is data, and the only names it can reach are metric names and config
fields, looked up by the analysis layer.

Claims (one comparison each; whitespace is free)::

    claim     := side CMP side                     CMP: <  >  <=  >=  ~=  (≈ is ~=)
    side      := NUMBER | quantity
    quantity  := target [ '[' selector ']' ]
    target    := METRIC                            mean of the metric over seeds
               | 'mean' '(' METRIC ')' | 'median' '(' METRIC ')' | 'iqm' '(' METRIC ')'
               | 'failure_rate'                    share of seeds failing (status failed, or the `failure:` rule)
               | 'slope' '(' METRIC '~' ['ln'] X ')'   fitted slope of METRIC against X (ln X: log-linear)
    selector  := cond { ',' cond }
    cond      := KEY '=' VALUE                     KEY: a config leaf (loops), a dotted path
                                                   (model.params.loops), or cell / family / task / baseline
    VALUE     := NUMBER | WORD | 'quoted string' | "quoted string"

`~=` (equivalence) and a `>=` / `<=` read as non-inferiority need the entry's `margin:` (claim_entries.py);
without one, `>=` reads as `>` and `<=` as `<`.

Examples::

    eval_exact_match[memory_slots=0] < eval_exact_match[memory_slots=8]
    eval_accuracy[block_layers=1, loops=4] ~= eval_accuracy[block_layers=4, loops=1]     (with margin: 0.02)
    failure_rate[halt_bias_init=0] > failure_rate[halt_bias_init=-3]
    slope(eval_accuracy ~ ln effective_depth)[family=looped] > 0
    iqm(eval_accuracy)[loops=4] >= 0.5

The failure rule (a trial fails when the rule is true of its final metrics)::

    rule   := or_
    or_    := and_ { 'or' and_ }
    and_   := not_ { 'and' not_ }
    not_   := 'not' not_ | atom
    atom   := '(' or_ ')' | METRIC [ CMP NUMBER ]   CMP: <  >  <=  >=  ==  !=
                                                    a bare METRIC is true when it is non-zero

e.g. ``eval_exact_match < 0.2 or halt_collapsed``.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

MAX_LENGTH = 1000  # characters per claim or rule
MAX_DEPTH = 50  # nested parentheses and `not`s in a rule (the parser recurses; Python's stack does not)

FUNCTIONS = ("mean", "median", "iqm", "slope")
CLAIM_OPS = ("<", ">", "<=", ">=", "~=")
EQUIVALENT = "~="  # `≈` is read as this operator
RULE_OPS = ("<", ">", "<=", ">=", "==", "!=")
KEYWORDS = ("and", "or", "not")
NON_FINITE = ("inf", "infinity", "nan")  # words YAML or Python would read as numbers; never a claim's number


class GrammarError(ValueError):
    """A claim or rule that does not parse; `position` is the 1-based column of the problem."""

    def __init__(self, message: str, position: int, text: str):
        self.message, self.position, self.text = message, position, text
        super().__init__(f"position {position}: {message} (in {text!r})")


# --- tokens ---------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<string>'[^'\n]*'|"[^"\n]*")
  | (?P<op><=|>=|==|!=|~=|≈|<|>|=|~)
  | (?P<arith>[-+*/%])
  | (?P<punct>[\[\](),])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # number, name, string, op, punct, end
    text: str
    pos: int  # 1-based column


def tokenize(text: str) -> list[Token]:
    if not isinstance(text, str):
        raise GrammarError("must be a string", 1, str(text))
    if len(text) > MAX_LENGTH:
        raise GrammarError(f"longer than {MAX_LENGTH} characters", MAX_LENGTH + 1, text[:40] + "...")
    tokens: list[Token] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            raise GrammarError(f"unexpected character {text[i]!r}", i + 1, text)
        kind = m.lastgroup
        if kind == "arith":
            if m.group() in "+-" and text[i + 1 : i + 4].lower() in ("inf", "nan"):
                raise GrammarError("numbers must be finite", i + 1, text)
            raise GrammarError("arithmetic is not part of the grammar", i + 1, text)
        after_value = bool(tokens) and (tokens[-1].kind in ("number", "name", "string") or tokens[-1].text in ")]")
        if kind == "number" and m.group()[0] in "+-" and after_value:
            raise GrammarError("arithmetic is not part of the grammar", i + 1, text)  # `a-1`, `x+2`
        if kind != "space":
            tokens.append(Token(kind, EQUIVALENT if m.group() == "≈" else m.group(), i + 1))
        i = m.end()
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        if len(self.tokens) == 1:
            raise GrammarError("empty", 1, text)

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def fail(self, message: str, tok: Token | None = None):
        tok = tok or self.tok
        found = "the end" if tok.kind == "end" else repr(tok.text)
        raise GrammarError(f"{message}, found {found}", tok.pos, self.text)

    def take(self, kind: str | None = None, text: str | None = None) -> Token | None:
        tok = self.tok
        if (kind is None or tok.kind == kind) and (text is None or tok.text == text):
            self.i += 1
            return tok
        return None

    def expect(self, kind: str | None, text: str | None, what: str) -> Token:
        tok = self.take(kind, text)
        if tok is None:
            self.fail(f"expected {what}")
        return tok

    def number(self, tok: Token) -> float:
        value = float(tok.text)
        if not math.isfinite(value):
            self.fail("numbers must be finite", tok)
        return value

    def end(self) -> None:
        if self.tok.kind != "end":
            self.fail("expected the end")


# --- claims ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    value: float

    def __str__(self) -> str:
        return f"{self.value:g}"


@dataclass(frozen=True)
class Quantity:
    kind: str  # mean, median, iqm, failure_rate, slope
    metric: str | None  # None for failure_rate
    selector: tuple[tuple[str, Any], ...] = ()
    x: str | None = None  # slope: the regressor (effective_depth, loops, a config field)
    log_x: bool = False
    text: str = ""  # as written

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Claim:
    lhs: Number | Quantity
    op: str
    rhs: Number | Quantity
    text: str

    @property
    def quantities(self) -> list[Quantity]:
        return [s for s in (self.lhs, self.rhs) if isinstance(s, Quantity)]


class _ClaimParser(_Parser):
    def claim(self) -> Claim:
        lhs = self.side()
        op = self.tok
        if op.kind != "op" or op.text not in CLAIM_OPS:
            if op.text in ("==", "!=", "="):
                self.fail("claims compare with <, >, <= or >= (equality cannot be shown from seeds)")
            self.fail("expected a comparison (<, >, <=, >=, ~=)")
        self.i += 1
        rhs = self.side()
        self.end()
        if isinstance(lhs, Number) and isinstance(rhs, Number):
            raise GrammarError("a claim needs a metric, failure_rate or slope on one side", 1, self.text)
        if (
            isinstance(lhs, Quantity)
            and isinstance(rhs, Quantity)
            and (lhs.kind == "failure_rate") != (rhs.kind == "failure_rate")
        ):
            raise GrammarError("failure_rate can only be compared with a number or another failure_rate", 1, self.text)
        return Claim(lhs, op.text, rhs, self.text)

    def side(self) -> Number | Quantity:
        tok = self.tok
        if tok.kind == "number":
            self.i += 1
            return Number(self.number(tok))
        if tok.kind != "name":
            self.fail("expected a metric name, failure_rate, mean(...), median(...), iqm(...), slope(...) or a number")
        if tok.text.lower() in NON_FINITE:
            self.fail("numbers must be finite (compare with a finite number such as 0.5)", tok)
        start = tok.pos
        self.i += 1
        name = tok.text
        x, log_x = None, False
        if self.take("punct", "("):
            if name not in FUNCTIONS:
                self.fail(f"unknown function {name!r}; functions: {', '.join(FUNCTIONS)}", tok)
            metric = self.metric_name()
            if name == "slope":
                self.expect("op", "~", "'~' (slope(METRIC ~ ln X))")
                if self.tok.kind == "name" and self.tok.text == "ln" and self.tokens[self.i + 1].kind == "name":
                    self.i += 1
                    log_x = True
                x_tok = self.expect("name", None, "the regressor (e.g. effective_depth or a config field)")
                if x_tok.text == "ln":
                    self.fail("expected the regressor after ln (e.g. ln effective_depth)", x_tok)
                x = x_tok.text
            self.expect("punct", ")", "')'")
            kind = name
        elif name == "failure_rate":
            kind, metric = "failure_rate", None
        elif name in FUNCTIONS:
            self.fail(f"{name} takes a metric in parentheses: {name}(METRIC)")
        else:
            if "." in name:
                self.fail("a metric name has no dots", tok)
            kind, metric = "mean", name
        selector: tuple[tuple[str, Any], ...] = ()
        if self.take("punct", "["):
            selector = self.selector()
        end = self.tokens[self.i - 1]
        text = self.text[start - 1 : end.pos - 1 + len(end.text)]
        return Quantity(kind, metric, selector, x, log_x, text)

    def metric_name(self) -> str:
        tok = self.expect("name", None, "a metric name")
        if "." in tok.text or tok.text in FUNCTIONS or tok.text == "failure_rate":
            self.fail("expected a metric name", tok)
        return tok.text

    def selector(self) -> tuple[tuple[str, Any], ...]:
        conds: list[tuple[str, Any]] = []
        while True:
            key = self.expect("name", None, "a field name (e.g. loops or model.params.loops)")
            self.expect("op", "=", "'=' after the field name")
            conds.append((key.text, self.value()))
            if self.take("punct", ","):
                continue
            self.expect("punct", "]", "',' or ']'")
            break
        keys = [k for k, _ in conds]
        if len(set(keys)) != len(keys):
            raise GrammarError("a field appears twice in one selector", key.pos, self.text)
        return tuple(conds)

    def value(self) -> Any:
        tok = self.tok
        if tok.kind == "number":
            self.i += 1
            value = self.number(tok)
            return int(value) if value.is_integer() and re.fullmatch(r"[-+]?\d+", tok.text) else value
        if tok.kind == "string":
            self.i += 1
            return tok.text[1:-1]
        if tok.kind == "name":
            if tok.text.lower() in NON_FINITE:
                self.fail("selector values must be finite (a value of the study's grid)", tok)
            self.i += 1
            return {"true": True, "false": False, "null": None}.get(tok.text, tok.text)
        self.fail("expected a value (a number, a word or a quoted string)")


def flip(op: str) -> str:
    """The operator read from the other side (`0.5 < x` is `x > 0.5`; `~=` is symmetric)."""
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<=", EQUIVALENT: EQUIVALENT}[op]


def parse_claim(text: str) -> Claim:
    """Parse one claim; raises GrammarError naming the position of the problem."""
    return _ClaimParser(text).claim()


# --- failure rule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    metric: str
    op: str | None  # None: the metric is true when non-zero
    value: float = 0.0


@dataclass(frozen=True)
class Not:
    arg: Any


@dataclass(frozen=True)
class BoolOp:
    op: str  # and, or
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Rule:
    expr: Any
    text: str

    @property
    def metrics(self) -> list[str]:
        found: list[str] = []

        def walk(node):
            if isinstance(node, Compare):
                found.append(node.metric)
            elif isinstance(node, Not):
                walk(node.arg)
            elif isinstance(node, BoolOp):
                for a in node.args:
                    walk(a)

        walk(self.expr)
        return list(dict.fromkeys(found))

    def __call__(self, metrics: dict[str, Any]) -> bool:
        """True when the trial fails. A metric the trial did not report makes its comparison false
        (a rule on `halt_collapsed` does not fail a family without halting); NaN makes it true."""
        return bool(_evaluate(self.expr, metrics))


_OPS = {
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def _evaluate(node: Any, metrics: dict[str, Any]) -> bool:
    if isinstance(node, BoolOp):
        results = (_evaluate(a, metrics) for a in node.args)
        return all(results) if node.op == "and" else any(results)
    if isinstance(node, Not):
        return not _evaluate(node.arg, metrics)
    value = metrics.get(node.metric)
    if value is None or isinstance(value, bool | str):
        if isinstance(value, bool):
            value = float(value)
        else:
            return False
    value = float(value)
    if math.isnan(value):
        return True
    if node.op is None:
        return value != 0
    return _OPS[node.op](value, node.value)


class _RuleParser(_Parser):
    def rule(self) -> Rule:
        expr = self.or_()
        self.end()
        return Rule(expr, self.text)

    def or_(self):
        args = [self.and_()]
        while self.take("name", "or"):
            args.append(self.and_())
        return args[0] if len(args) == 1 else BoolOp("or", tuple(args))

    def and_(self):
        args = [self.not_()]
        while self.take("name", "and"):
            args.append(self.not_())
        return args[0] if len(args) == 1 else BoolOp("and", tuple(args))

    depth = 0

    def nested(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise GrammarError(
                f"nested more than {MAX_DEPTH} deep (parentheses and `not`s); write it flatter", tok.pos, self.text
            )

    def not_(self):
        tok = self.tok
        if self.take("name", "not"):
            self.nested(tok)
            inner = Not(self.not_())
            self.depth -= 1
            return inner
        return self.atom()

    def atom(self):
        tok = self.tok
        if self.take("punct", "("):
            self.nested(tok)
            inner = self.or_()
            self.expect("punct", ")", "')'")
            self.depth -= 1
            return inner
        tok = self.tok
        if tok.kind != "name" or tok.text in KEYWORDS:
            self.fail("expected a metric name or '('")
        if "." in tok.text:
            self.fail("a metric name has no dots")
        self.i += 1
        op = self.tok
        if op.kind == "op" and op.text in RULE_OPS:
            self.i += 1
            num = self.tok
            if num.kind != "number":
                self.fail("expected a number after the comparison")
            self.i += 1
            return Compare(tok.text, op.text, self.number(num))
        if op.kind == "op":
            self.fail("expected one of <, >, <=, >=, ==, !=")
        return Compare(tok.text, None)


def parse_rule(text: str) -> Rule:
    """Parse a `failure:` rule; raises GrammarError naming the position of the problem."""
    return _RuleParser(text).rule()


def values_equal(a: Any, b: Any) -> bool:
    """A config value equals a selector value: numbers numerically (4 == 4.0), bools as bools, else text.
    An unset value is None in a compiled config but NaN in the ledger's table (a column other cells set), so
    both are unset here: `validate` and `verify` must agree on what a selector matches."""
    if isinstance(a, float) and math.isnan(a):
        a = None
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if b is None or (a is None and b == "None"):  # `null`, or Python's spelling of it
        return a is None
    if isinstance(a, numbers.Real) and isinstance(b, int | float):
        return float(a) == float(b)
    return str(a) == str(b)


# Selector keys that are not config fields, and the columns (flattened-config paths) they stand for.
SELECTOR_ALIASES = {
    "family": "model.family",
    "task": "task.name",
    "cell": "cell",
    "baseline": "baseline",
    "seed": "seed",
}


def selector_column(key: str, paths: list[str], varied: list[str]) -> tuple[str | None, list[str]]:
    """The column a selector key names among flattened-config `paths` (`varied`: those that differ between
    cells): an alias, a dotted path, the one path ending in the key, or the one varied path of several.
    (column, []) when found; (None, the paths ending in it) when it is ambiguous; (None, []) when unknown.
    `validate` and the analysis resolve keys by this one rule, so a claim that validates selects the same."""
    if key in SELECTOR_ALIASES:
        return SELECTOR_ALIASES[key], []
    if "." in key and key in paths:
        return key, []
    leaves = [p for p in paths if p.rsplit(".", 1)[-1] == key]
    if len(leaves) == 1:
        return leaves[0], []
    chosen = [p for p in leaves if p in varied]
    return (chosen[0], []) if len(chosen) == 1 else (None, leaves)
