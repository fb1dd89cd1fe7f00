from minicalc import CalcError, Token, tokenize


def kinds(text):
    return [(t.kind, t.value) for t in tokenize(text)]


def test_tokenize_simple():
    assert kinds("1 + 22") == [("num", 1), ("op", "+"), ("num", 22), ("end", None)]


def test_tokenize_positions():
    assert tokenize("ab*(3)") == [Token("name", "ab", 0), Token("op", "*", 2), Token("op", "(", 3),
                                  Token("num", 3, 4), Token("op", ")", 5), Token("end", None, 6)]


def test_tokenize_floats():
    assert kinds("1.5 .25 2.") == [("num", 1.5), ("num", 0.25), ("num", 2.0), ("end", None)]


def test_tokenize_exponent():
    assert kinds("1e3 2.5E-1") == [("num", 1000.0), ("num", 0.25), ("end", None)]


def test_tokenize_floor_division():
    assert kinds("7//2/1") == [("num", 7), ("op", "//"), ("num", 2), ("op", "/"), ("num", 1), ("end", None)]


def test_tokenize_names_with_digits():
    assert kinds("x_1+y2") == [("name", "x_1"), ("op", "+"), ("name", "y2"), ("end", None)]


def test_tokenize_bad_character():
    try:
        tokenize("1 + $")
    except CalcError as e:
        assert e.pos == 4
        return
    raise AssertionError("tokenize('1 + $') should raise CalcError")


def test_tokenize_two_dots():
    try:
        tokenize("1.2.3")
    except CalcError as e:
        assert e.pos == 3
        return
    raise AssertionError("tokenize('1.2.3') should raise CalcError")


def test_tokenize_exponent_without_digits():
    try:
        tokenize("2e+")
    except CalcError:
        return
    raise AssertionError("tokenize('2e+') should raise CalcError")
