from textkit import (center, common_prefix, from_roman, is_palindrome, levenshtein, to_roman, top_words, truncate,
                     word_count, wrap)


def test_wrap_basic():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]


def test_wrap_long_word():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]


def test_wrap_rejects_zero_width():
    try:
        wrap("abc", 0)
    except ValueError:
        return
    raise AssertionError("wrap('abc', 0) should raise ValueError")


def test_truncate_short_text_unchanged():
    assert truncate("hello", 5) == "hello"


def test_truncate_cuts_with_ellipsis():
    assert truncate("hello world", 8) == "hello..."


def test_truncate_tiny_length():
    assert truncate("hello world", 2) == ".."


def test_center_even_and_odd():
    assert center("ab", 6, "*") == "**ab**"
    assert center("ab", 5, "*") == "*ab**"


def test_center_too_wide_text():
    assert center("abcdef", 3) == "abcdef"


def test_word_count():
    assert word_count("  one two\tthree\nfour ") == 4


def test_top_words_order():
    text = "b a b c a b. The the"
    assert top_words(text, 2) == [("b", 3), ("a", 2)]


def test_top_words_ties_keep_first_use():
    assert top_words("x y z y x", 3) == [("x", 2), ("y", 2), ("z", 1)]


def test_levenshtein():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("flaw", "lawn") == 2


def test_levenshtein_same():
    assert levenshtein("same", "same") == 0


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert not is_palindrome("palindrome")


def test_is_palindrome_near_miss():
    assert not is_palindrome("abca")


def test_common_prefix():
    assert common_prefix(["interview", "internet", "interval"]) == "inter"
    assert common_prefix([]) == ""
    assert common_prefix(["abc", "xyz"]) == ""


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert to_roman(4) == "IV"


def test_to_roman_range():
    for bad in (0, 4000):
        try:
            to_roman(bad)
        except ValueError:
            continue
        raise AssertionError(f"to_roman({bad}) should raise ValueError")


def test_from_roman():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("xlii") == 42


def test_from_roman_rejects_non_canonical():
    try:
        from_roman("IIII")
    except ValueError:
        return
    raise AssertionError("from_roman('IIII') should raise ValueError")


def test_roman_round_trip():
    for n in range(1, 400):
        assert from_roman(to_roman(n)) == n
