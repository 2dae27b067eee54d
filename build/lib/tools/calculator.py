"""The calculator tool: evaluates an arithmetic expression (runs inside the sandbox).

Only numbers, parentheses and + - * / // % ** are accepted; anything else (names, calls,
attributes) is an error the model sees. The sandbox bounds what remains, e.g. `9**9**9**9`
runs out of time or memory there instead of in the trainer.
"""

from __future__ import annotations

import ast
import operator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")


def calculate(expression: str) -> str:
    """The value of `expression`; integers stay exact, floats print with up to 12 significant digits."""
    value = _evaluate(ast.parse(expression.replace("^", "**"), mode="eval"))
    return str(value) if isinstance(value, int) else f"{value:.12g}"
