"""Fitting text into a width."""


def wrap(text, width):
    """Greedy word wrap: lines of at most `width` characters; longer words get a line of their own."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def truncate(text, length, ellipsis="..."):
    """`text` cut to at most `length` characters, ending in `ellipsis` when something was cut."""
    if len(text) <= length:
        return text
    if length <= len(ellipsis):
        return ellipsis[:length]
    return text[: length - len(ellipsis)].rstrip() + ellipsis


def center(text, width, fill=" "):
    """`text` padded on both sides to `width`; an odd leftover goes to the right."""
    if len(fill) != 1:
        raise ValueError("fill must be one character")
    missing = width - len(text)
    if missing <= 0:
        return text
    left = missing // 2
    right = missing - left
    return fill * left + text + fill * right
