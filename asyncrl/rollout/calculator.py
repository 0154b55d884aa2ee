"""`calculate`: the calculator tool: + - * / // % ** and parentheses over numbers, nothing else (no names,
no calls, no attribute access), with bounded sizes so no expression can take long or use much memory."""

from __future__ import annotations

import ast
import math
import operator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e18


class CalculatorError(ValueError):
    pass


def calculate(expression: str) -> str:
    """The value of `expression` as text ("12", "0.5"), or CalculatorError with why not."""
    if not isinstance(expression, str) or len(expression) > MAX_CHARS:
        raise CalculatorError(f"give an arithmetic expression of at most {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(value, complex) or not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            raise CalculatorError("the result is out of range")
        return value
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")
