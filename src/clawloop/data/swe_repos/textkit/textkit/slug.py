"""URL slugs."""

import unicodedata


def slugify(text, sep="-", max_length=None):
    """Lower-case ASCII words of `text` joined by `sep`, at most `max_length` characters.

    Accents are dropped ("Café" -> "cafe"); a cut never leaves a trailing separator
    and never splits a word unless the first word alone is too long.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = []
    word = ""
    for ch in ascii_text.lower():
        if ch.isalnum():
            word += ch
        elif word:
            words.append(word)
            word = ""
    if word:
        words.append(word)
    slug = sep.join(words)
    if max_length is None or len(slug) <= max_length:
        return slug
    cut = ""
    for w in words:
        candidate = w if not cut else cut + sep + w
        if len(candidate) > max_length:
            break
        cut = candidate
    if not cut:
        cut = words[0][:max_length]
    return cut
