"""Roman numerals, 1 to 3999."""

NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
            (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError(f"{number} is out of range (1..3999)")
    out = []
    for value, symbol in NUMERALS:
        while number >= value:
            out.append(symbol)
            number -= value
    return "".join(out)


def from_roman(text):
    """The value of a Roman numeral; ValueError for anything that is not one in canonical form."""
    text = text.strip().upper()
    if not text or any(c not in VALUES for c in text):
        raise ValueError(f"not a Roman numeral: {text!r}")
    total = 0
    for i, c in enumerate(text):
        value = VALUES[c]
        if i + 1 < len(text) and VALUES[text[i + 1]] > value:
            total -= value
        else:
            total += value
    if to_roman(total) != text:
        raise ValueError(f"not a canonical Roman numeral: {text!r}")
    return total
