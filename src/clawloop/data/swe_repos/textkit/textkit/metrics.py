"""Counting and comparing text."""


def word_count(text):
    return len(text.split())


def top_words(text, n=3):
    """The `n` most frequent lower-cased words, most frequent first, ties in order of first use."""
    counts = {}
    order = {}
    for i, raw in enumerate(text.lower().split()):
        word = raw.strip(".,;:!?\"'()")
        if not word:
            continue
        if word not in counts:
            counts[word] = 0
            order[word] = i
        counts[word] += 1
    ranked = sorted(counts, key=lambda w: (-counts[w], order[w]))
    return [(w, counts[w]) for w in ranked[:n]]


def levenshtein(a, b):
    """Edit distance: insertions, deletions and substitutions each cost 1."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            insert = current[j - 1] + 1
            delete = previous[j] + 1
            substitute = previous[j - 1] + (ca != cb)
            current.append(min(insert, delete, substitute))
        previous = current
    return previous[-1]


def is_palindrome(text):
    """True when the letters and digits of `text` read the same both ways (case ignored)."""
    chars = [c.lower() for c in text if c.isalnum()]
    i, j = 0, len(chars) - 1
    while i < j:
        if chars[i] != chars[j]:
            return False
        i += 1
        j -= 1
    return True


def common_prefix(words):
    """The longest prefix all `words` share ("" for no words)."""
    if not words:
        return ""
    prefix = words[0]
    for w in words[1:]:
        k = 0
        while k < len(prefix) and k < len(w) and prefix[k] == w[k]:
            k += 1
        prefix = prefix[:k]
    return prefix
