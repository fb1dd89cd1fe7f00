"""Recursive-descent parser: tokens to a tree of tuples.

Nodes: ("num", value), ("name", id), ("neg", node), ("bin", op, left, right),
("call", name, [args]), ("assign", name, node), ("seq", [statements]).
"""

from minicalc.errors import CalcError
from minicalc.tokenizer import tokenize


class _Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.i = 0

    def peek(self):
        return self.tokens[self.i]

    def next(self):
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def accept(self, op):
        tok = self.peek()
        if tok.kind == "op" and tok.value == op:
            self.i += 1
            return True
        return False

    def expect(self, op):
        if not self.accept(op):
            tok = self.peek()
            found = "end of input" if tok.kind == "end" else repr(tok.value)
            raise CalcError(f"expected {op!r}, found {found}", tok.pos)

    def program(self):
        statements = [self.statement()]
        while self.accept(";"):
            if self.peek().kind == "end":
                break
            statements.append(self.statement())
        tok = self.peek()
        if tok.kind != "end":
            raise CalcError(f"unexpected {tok.value!r}", tok.pos)
        return statements[0] if len(statements) == 1 else ("seq", statements)

    def statement(self):
        tok = self.peek()
        after = self.tokens[self.i + 1]
        if tok.kind == "name" and after.kind == "op" and after.value == "=":
            self.i += 2
            return ("assign", tok.value, self.expression())
        return self.expression()

    def expression(self):
        node = self.term()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in ("+", "-"):
                self.i += 1
                node = ("bin", tok.value, node, self.term())
            else:
                return node

    def term(self):
        node = self.unary()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in ("*", "/", "//", "%"):
                self.i += 1
                node = ("bin", tok.value, node, self.unary())
            else:
                return node

    def unary(self):
        if self.accept("-"):
            return ("neg", self.unary())
        if self.accept("+"):
            return self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.accept("^"):
            # Right-associative, and the exponent may carry its own sign: 2 ^ -1.
            return ("bin", "^", base, self.unary())
        return base

    def atom(self):
        tok = self.next()
        if tok.kind == "num":
            return ("num", tok.value)
        if tok.kind == "name":
            if self.accept("("):
                args = []
                if not self.accept(")"):
                    args.append(self.expression())
                    while self.accept(","):
                        args.append(self.expression())
                    self.expect(")")
                return ("call", tok.value, args)
            return ("name", tok.value)
        if tok.kind == "op" and tok.value == "(":
            node = self.expression()
            self.expect(")")
            return node
        found = "end of input" if tok.kind == "end" else repr(tok.value)
        raise CalcError(f"expected a number, name or '(', found {found}", tok.pos)


def parse(text):
    return _Parser(tokenize(text)).program()
