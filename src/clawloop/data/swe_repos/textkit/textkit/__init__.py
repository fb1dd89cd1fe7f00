"""textkit: small text utilities."""

from textkit.case import camel_case, kebab_case, snake_case, split_words, title_case
from textkit.metrics import common_prefix, levenshtein, is_palindrome, top_words, word_count
from textkit.roman import from_roman, to_roman
from textkit.slug import slugify
from textkit.wrap import center, truncate, wrap

__all__ = ["camel_case", "kebab_case", "snake_case", "split_words", "title_case", "common_prefix", "levenshtein",
           "is_palindrome", "top_words", "word_count", "from_roman", "to_roman", "slugify", "center", "truncate",
           "wrap"]
