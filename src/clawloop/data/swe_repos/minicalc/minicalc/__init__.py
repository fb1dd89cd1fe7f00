"""minicalc: tokenize, parse and evaluate arithmetic expressions."""

from minicalc.errors import CalcError
from minicalc.evaluator import calc, evaluate
from minicalc.parser import parse
from minicalc.tokenizer import Token, tokenize

__all__ = ["CalcError", "calc", "evaluate", "parse", "Token", "tokenize"]
