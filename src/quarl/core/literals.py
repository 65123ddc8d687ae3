"""Literals written as text (RL Zoo YAML values, ``--hp`` values, SB3's stored reprs), read
without evaluating anything: names are kept as their dotted text."""

from __future__ import annotations

import ast
from typing import Any


class _Names(ast.NodeTransformer):
    """Turn bare names and attributes (``nn.ReLU``) into their dotted text."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("True", "False", "None"):
            return node
        return ast.copy_location(ast.Constant(node.id), node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return ast.copy_location(ast.Constant(ast.unparse(node)), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        # dict(a=1) -> {'a': 1}; any other call is kept as its text
        if isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return ast.copy_location(
                ast.Dict([ast.Constant(k.arg) for k in node.keywords], [self.visit(k.value) for k in node.keywords]),
                node,
            )
        return ast.copy_location(ast.Constant(ast.unparse(node)), node)


def parse_literal(text: str) -> Any:
    """A Python literal written as text, with names kept as strings: never evaluated."""
    text = text.strip()
    if text.startswith("<class '") and text.endswith("'>"):
        return text[len("<class '") : -2]
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return text
    try:
        return ast.literal_eval(_Names().visit(tree))
    except (ValueError, TypeError):  # an expression, not a literal (the zoo's lin_3e-4 reads as lin_3e - 4): text
        return text
