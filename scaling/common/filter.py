"""A row-filter language that cannot run code: conditions on a table's columns (``fit --where``,
``compare --where``).

Filters used to go through ``DataFrame.query``, whose ``@name`` reaches the caller's variables and
whose method calls reach everything (``loss.to_csv('x') != 1`` wrote a file). Here the text is
parsed with :mod:`ast` and only this grammar is accepted; it is evaluated by this module on numpy
arrays, so nothing in it can call a function, read an attribute or index anything.

Grammar (Python's syntax and precedence, a subset of it)::

    expr    := expr 'or' expr | expr 'and' expr | 'not' expr
             | expr ('|' | '&') expr | '~' expr          (element-wise or/and/not, as in pandas)
             | sum (CMP sum)+                            (chains: 1e6 < N <= 1e8)
             | sum ('in' | 'not in') '[' literal, ... ']'
             | sum
    sum     := sum ('+' | '-' | '*' | '/' | '**') sum | ('-' | '+') sum | '(' expr ')' | atom
    atom    := NAME | `any column name` | NUMBER | 'string' | True | False
    CMP     := '==' | '!=' | '<' | '<=' | '>' | '>='

NAME is a column of the table (backticks quote a name that is not an identifier, as pandas does).
Anything else -- attribute access, calls, subscripts, ``@names``, lambdas, comprehensions,
f-strings, names with double underscores -- is a one-line error naming the construct. The text is
bounded (:data:`MAX_LENGTH` characters, :data:`MAX_DEPTH` levels of nesting).

Values follow numpy (and hence pandas): a comparison with a missing value (NaN) is False except
``!=``; numbers are floats (an integer literal ``10**400`` is inf, never a huge integer).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from scaling.common.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

MAX_LENGTH = 1000
MAX_DEPTH = 32
_PLACEHOLDER = "_smelt_col_{}_"

GRAMMAR = ("a condition on the table's columns: comparisons (== != < <= > >=, chains such as "
           "'1e6 < N <= 1e8'), 'in [...]' / 'not in [...]' with literal lists, and/or/not (or & | ~), "
           "arithmetic (+ - * / ** and unary -), parentheses, numbers, 'strings', True/False; "
           "`backticks` quote a column name with spaces. No calls, attributes, subscripts or @names.")

_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
# What a refused node is called in the message (the construct, in the user's terms).
_NAMES: dict[type, str] = {
    ast.Attribute: "attribute access (.name)", ast.Call: "function or method calls",
    ast.Subscript: "subscripts ([...])", ast.Lambda: "lambda", ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions", ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions",
    ast.IfExp: "'x if c else y'", ast.NamedExpr: "':='", ast.Dict: "dicts", ast.Set: "sets",
    ast.JoinedStr: "f-strings", ast.Starred: "'*'", ast.Await: "await", ast.Yield: "yield",
    ast.Slice: "slices", ast.MatMult: "'@'", ast.Mod: "'%'", ast.FloorDiv: "'//'",
    ast.LShift: "'<<'", ast.RShift: "'>>'", ast.BitXor: "'^'", ast.Is: "'is'", ast.IsNot: "'is not'",
}


def _describe(node: ast.AST) -> str:
    return _NAMES.get(type(node), type(node).__name__)


@dataclass(frozen=True)
class RowFilter:
    """A parsed, checked filter: ``text`` as given, the columns it reads, and the checked tree."""

    text: str
    columns: tuple[str, ...]
    _tree: ast.Expression
    _names: Mapping[str, str]   # placeholder identifier -> the backticked column name

    def evaluate(self, data: Mapping[str, np.ndarray], n_rows: int) -> np.ndarray:
        """The boolean mask of the rows that satisfy the filter; ``data`` maps each column name to
        its values. UserError for an unknown column or a condition that is not per row."""
        missing = [c for c in self.columns if c not in data]
        if missing:
            raise UserError(f"the row filter {self.text!r} names no column {missing[0]!r} "
                            f"(columns: {', '.join(map(str, data))})")
        with np.errstate(all="ignore"):
            value = _Evaluator(data, self._names).run(self._tree.body)
        if isinstance(value, np.ndarray) and value.dtype == bool and value.shape == (n_rows,):
            return value
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, np.ndarray) and value.ndim == 0):
            raise UserError(f"the row filter {self.text!r} does not depend on any column")
        raise UserError(f"the row filter {self.text!r} is not a condition on rows (a comparison such as "
                        "'loss < 4')")


def parse_filter(text: str) -> RowFilter:
    """Check ``text`` against the grammar (module doc); UserError naming the first refused construct."""
    if not isinstance(text, str) or not text.strip():
        raise UserError("the row filter is empty")
    if len(text) > MAX_LENGTH:
        raise UserError(f"the row filter is {len(text)} characters long; at most {MAX_LENGTH}")
    source, names = _unquote(text)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise UserError(f"the row filter {text!r} is not an expression ({exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise UserError(f"the row filter {text!r} is nested too deeply") from None
    columns: list[str] = []
    _check(tree.body, names, columns, depth=0, text=text)
    return RowFilter(text, tuple(dict.fromkeys(columns)), tree, names)


def _unquote(text: str) -> tuple[str, dict[str, str]]:
    """Backticked names become placeholder identifiers; '@' outside strings is refused (pandas reads
    ``@name`` as the caller's variable, which is how the old filter ran code)."""
    out: list[str] = []
    names: dict[str, str] = {}
    i, quote = 0, None
    while i < len(text):
        ch = text[i]
        if quote is not None:
            out.append(ch)
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise UserError(f"the row filter {text!r} has an unclosed backtick")
            key = _PLACEHOLDER.format(len(names))
            names[key] = text[i + 1:end]
            out.append(f" {key} ")
            i = end
        elif ch == "@":
            raise UserError(f"the row filter {text!r} uses '@' (variables outside the table): not allowed; "
                            "a filter sees only the table's columns")
        else:
            out.append(ch)
        i += 1
    return "".join(out), names


def _check(node: ast.AST, names: Mapping[str, str], columns: list[str], depth: int, text: str) -> None:
    if depth > MAX_DEPTH:
        raise UserError(f"the row filter {text!r} is nested more than {MAX_DEPTH} levels deep")

    def refuse(what: ast.AST | str) -> UserError:
        return UserError(f"the row filter {text!r} uses "
                         f"{what if isinstance(what, str) else _describe(what)}: not allowed (a filter "
                         "holds only column names, literals, comparisons, and/or/not, in [...] and "
                         "arithmetic)")

    def sub(child: ast.AST) -> None:
        _check(child, names, columns, depth + 1, text)

    if isinstance(node, ast.BoolOp):
        for v in node.values:
            sub(v)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.Not, ast.Invert, ast.USub, ast.UAdd)):
            raise refuse(node.op)
        sub(node.operand)
    elif isinstance(node, ast.BinOp):
        if not isinstance(node.op, (*_ARITH, ast.BitAnd, ast.BitOr)):
            raise refuse(node.op)
        sub(node.left)
        sub(node.right)
    elif isinstance(node, ast.Compare):
        sub(node.left)
        if len(node.ops) > 1 and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            raise refuse("'in' inside a chain of comparisons (use 'and')")
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                if not isinstance(right, (ast.List, ast.Tuple)):
                    raise refuse("'in' with something other than a literal list [..]")
                for elt in right.elts:
                    if not _is_literal(elt):
                        raise refuse("'in [...]' with an element that is not a number or string literal")
            elif type(op) not in _COMPARE:
                raise refuse(op)
            else:
                sub(right)
    elif isinstance(node, ast.Name):
        if node.id in names:
            columns.append(names[node.id])
        elif "__" in node.id:
            raise refuse(f"the name {node.id!r} (double underscores)")
        else:
            columns.append(node.id)
    elif isinstance(node, ast.Constant):
        if not _is_literal(node):
            raise refuse(f"the literal {node.value!r}")
    else:
        raise refuse(node)


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_literal(node.operand) and not isinstance(getattr(node.operand, "value", None), str)
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool))
            and not isinstance(node.value, complex))


def _literal(node: ast.AST) -> Any:
    """A checked literal's value; numbers as float64 (never a Python big integer)."""
    if isinstance(node, ast.UnaryOp):
        v = _literal(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    v = node.value  # type: ignore[attr-defined]
    if isinstance(v, bool) or isinstance(v, str):
        return v
    try:
        return np.float64(v)
    except OverflowError:       # an integer literal beyond float range
        return np.float64(np.inf) if v > 0 else np.float64(-np.inf)


class _Evaluator:
    """Evaluate a checked tree on numpy arrays (only the node types :func:`_check` lets through)."""

    def __init__(self, data: Mapping[str, np.ndarray], names: Mapping[str, str]):
        self.data, self.names = data, names

    def run(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return _literal(node)
        if isinstance(node, ast.Name):
            return self.data[self.names.get(node.id, node.id)]
        if isinstance(node, ast.BoolOp):
            values = [self._bool(self.run(v), "and" if isinstance(node.op, ast.And) else "or")
                      for v in node.values]
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = values[0]
            for v in values[1:]:
                out = combine(out, v)
            return out
        if isinstance(node, ast.UnaryOp):
            value = self.run(node.operand)
            if isinstance(node.op, (ast.Not, ast.Invert)):
                return np.logical_not(self._bool(value, "not" if isinstance(node.op, ast.Not) else "~"))
            return self._apply(operator.neg if isinstance(node.op, ast.USub) else operator.pos, value, None,
                               "unary minus")
        if isinstance(node, ast.BinOp):
            left, right = self.run(node.left), self.run(node.right)
            if isinstance(node.op, (ast.BitAnd, ast.BitOr)):
                word = "&" if isinstance(node.op, ast.BitAnd) else "|"
                combine = np.logical_and if word == "&" else np.logical_or
                return combine(self._bool(left, word), self._bool(right, word))
            return self._apply(_ARITH[type(node.op)], left, right, "arithmetic")
        if isinstance(node, ast.Compare):
            left = self.run(node.left)
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    values = [_literal(e) for e in right_node.elts]  # type: ignore[attr-defined]
                    hit = self._isin(left, values)
                    result = hit if isinstance(op, ast.In) else np.logical_not(hit)
                else:
                    right = self.run(right_node)
                    result = self._apply(_COMPARE[type(op)], left, right, "comparison")
                    left = right
                out = result if out is None else np.logical_and(out, result)
            return out
        raise UserError(f"cannot evaluate {_describe(node)}")  # unreachable after _check

    @staticmethod
    def _bool(value: Any, word: str) -> Any:
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, np.ndarray) and value.dtype == bool):
            return value
        raise UserError(f"'{word}' joins conditions (comparisons), not values: put a comparison on each side")

    @staticmethod
    def _apply(fn: Callable, left: Any, right: Any, what: str) -> Any:
        try:
            out = fn(left) if right is None and what == "unary minus" else fn(left, right)
        except (TypeError, ValueError) as exc:
            reason = " ".join(str(exc).split())
            raise UserError(f"{what} on values of incompatible types ({reason})") from None
        if what == "comparison" and isinstance(out, np.ndarray) and out.dtype != bool:
            out = out.astype(bool)
        return out

    @staticmethod
    def _isin(left: Any, values: list) -> Any:
        if isinstance(left, np.ndarray):
            if left.dtype == object or left.dtype.kind in "US":
                return np.array([v in values for v in left.tolist()], dtype=bool)
            return np.isin(left, [v for v in values if not isinstance(v, str)])
        return left in values


def filter_mask(text: str, data: Mapping[str, np.ndarray], n_rows: int) -> np.ndarray:
    """Parse and evaluate in one step (see :func:`parse_filter`, :meth:`RowFilter.evaluate`)."""
    return parse_filter(text).evaluate(data, n_rows)


def filter_rows(table: "pd.DataFrame", where: Iterable[str], source: str) -> "pd.DataFrame":
    """The rows of ``table`` satisfying every filter in ``where``, in order (the one way a command
    filters rows: ``fit --where``, ``compare --where``). A refused or failing filter is a UserError
    that names ``source`` and the filter. A single string is one filter (never its characters)."""
    for expr in ((where,) if isinstance(where, str) else where):
        try:
            mask = filter_mask(expr, {c: table[c].to_numpy() for c in table.columns}, len(table))
        except UserError as exc:
            msg = str(exc) if str(exc).startswith("the row filter") else f"the row filter {expr!r}: {exc}"
            raise UserError(f"{source}: {msg}") from None
        table = table[mask]
    return table
