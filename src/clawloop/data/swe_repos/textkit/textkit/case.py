"""Splitting identifiers into words and joining them in another case."""

SMALL_WORDS = {"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"}


def split_words(text):
    """Split `text` into words at spaces, punctuation, and case changes.

    "parseHTTPResponse" -> ["parse", "HTTP", "Response"]; digits stay with their word.
    """
    words = []
    current = ""
    for i, ch in enumerate(text):
        if not ch.isalnum():
            if current:
                words.append(current)
            current = ""
            continue
        if current:
            prev = current[-1]
            nxt = text[i + 1] if i + 1 < len(text) else ""
            lower_to_upper = prev.islower() and ch.isupper()
            acronym_end = prev.isupper() and ch.isupper() and nxt.islower()
            if lower_to_upper or acronym_end:
                words.append(current)
                current = ""
        current += ch
    if current:
        words.append(current)
    return words


def snake_case(text):
    return "_".join(w.lower() for w in split_words(text))


def kebab_case(text):
    return "-".join(w.lower() for w in split_words(text))


def camel_case(text, upper_first=False):
    words = split_words(text)
    out = []
    for i, w in enumerate(words):
        if i == 0 and not upper_first:
            out.append(w.lower())
        else:
            out.append(w[:1].upper() + w[1:].lower())
    return "".join(out)


def title_case(text):
    """Capitalise words, except small words that are neither first nor last."""
    words = text.split()
    out = []
    for i, w in enumerate(words):
        inner = 0 < i < len(words) - 1
        if inner and w.lower() in SMALL_WORDS:
            out.append(w.lower())
        else:
            out.append(w[:1].upper() + w[1:].lower())
    return " ".join(out)
