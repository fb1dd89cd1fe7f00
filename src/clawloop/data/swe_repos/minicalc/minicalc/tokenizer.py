"""Splitting an expression into tokens."""

from minicalc.errors import CalcError

OPERATORS = ("//", "+", "-", "*", "/", "%", "^", "(", ")", ",", ";", "=")


class Token:
    __slots__ = ("kind", "value", "pos")

    def __init__(self, kind, value, pos):
        self.kind = kind  # "num", "name", "op" or "end"
        self.value = value
        self.pos = pos

    def __repr__(self):
        return f"Token({self.kind!r}, {self.value!r}, {self.pos})"

    def __eq__(self, other):
        return isinstance(other, Token) and (self.kind, self.value, self.pos) == (other.kind, other.value, other.pos)


def _number(text, i):
    """The number starting at `i`: (value, next index). Ints stay ints; one dot or an exponent makes a float."""
    start = i
    seen_dot = False
    while i < len(text) and (text[i].isdigit() or text[i] == "."):
        if text[i] == ".":
            if seen_dot:
                raise CalcError("a number has two decimal points", i)
            seen_dot = True
        i += 1
    is_float = seen_dot
    if i < len(text) and text[i] in "eE":
        j = i + 1
        if j < len(text) and text[j] in "+-":
            j += 1
        if j >= len(text) or not text[j].isdigit():
            raise CalcError("an exponent needs digits", j)
        while j < len(text) and text[j].isdigit():
            j += 1
        i = j
        is_float = True
    literal = text[start:i]
    if literal == ".":
        raise CalcError("a lone '.' is not a number", start)
    return (float(literal) if is_float else int(literal)), i


def tokenize(text):
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            value, end = _number(text, i)
            tokens.append(Token("num", value, i))
            i = end
        elif ch.isalpha() or ch == "_":
            j = i + 1
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            tokens.append(Token("name", text[i:j], i))
            i = j
        else:
            for op in OPERATORS:
                if text.startswith(op, i):
                    tokens.append(Token("op", op, i))
                    i += len(op)
                    break
            else:
                raise CalcError(f"unexpected character {ch!r}", i)
    tokens.append(Token("end", None, len(text)))
    return tokens
