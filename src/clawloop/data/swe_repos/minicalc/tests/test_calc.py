import math

from minicalc import CalcError, calc, parse


def raises_calc_error(text, **variables):
    try:
        calc(text, **variables)
    except CalcError:
        return True
    return False


def test_precedence():
    assert calc("2 + 3 * 4") == 14
    assert calc("(2 + 3) * 4") == 20
    assert calc("10 - 4 - 3") == 3


def test_division_kinds():
    assert calc("7 / 2") == 3.5
    assert calc("7 // 2") == 3
    assert calc("-7 // 2") == -4
    assert calc("7 % 3") == 1


def test_left_associative_division():
    assert calc("100 / 10 / 5") == 2


def test_power_right_associative():
    assert calc("2 ^ 3 ^ 2") == 512


def test_unary_minus_and_power():
    assert calc("-2 ^ 2") == -4
    assert calc("2 ^ -1") == 0.5
    assert calc("--3") == 3
    assert calc("+4") == 4


def test_parse_tree():
    assert parse("1 - x * 2") == ("bin", "-", ("num", 1), ("bin", "*", ("name", "x"), ("num", 2)))


def test_variables():
    assert calc("a * b + c", a=2, b=5, c=1) == 11


def test_constants():
    assert calc("2 * pi") == 2 * math.pi


def test_functions():
    assert calc("max(1, 7, 3) - min(4, 2)") == 5
    assert calc("abs(-3) + sqrt(16)") == 7
    assert calc("round(2.567, 2)") == 2.57


def test_assignments():
    assert calc("x = 4; y = x * 2; y - 1") == 7
    assert calc("x = 1;") == 1


def test_assignment_does_not_leak():
    variables = {"x": 1}
    assert calc("x = 5; x", **variables) == 5
    assert variables == {"x": 1}


def test_division_by_zero():
    assert raises_calc_error("1 / 0")
    assert raises_calc_error("1 % (2 - 2)")


def test_zero_negative_power():
    assert raises_calc_error("0 ^ -1")
    assert calc("0 ^ 0") == 1


def test_unknown_name():
    assert raises_calc_error("y + 1")


def test_unknown_function():
    assert raises_calc_error("cube(2)")


def test_function_arity():
    assert raises_calc_error("sqrt(1, 2)")
    assert raises_calc_error("round()")
    assert calc("round(2.5)") == 2


def test_sqrt_negative():
    assert raises_calc_error("sqrt(-4)")


def test_syntax_errors():
    assert raises_calc_error("1 +")
    assert raises_calc_error("(1 + 2")
    assert raises_calc_error("1 2")
    assert raises_calc_error("max(1,)")


def test_error_position():
    try:
        calc("1 + )")
    except CalcError as e:
        assert e.pos == 4
        return
    raise AssertionError("calc('1 + )') should raise CalcError")


def test_call_without_arguments_error_message():
    try:
        calc("max()")
    except CalcError as e:
        assert "takes 1+ argument(s), got 0" in str(e)
        return
    raise AssertionError("calc('max()') should raise CalcError")
