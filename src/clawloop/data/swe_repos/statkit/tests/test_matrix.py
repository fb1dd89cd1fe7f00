from statkit import Matrix


def test_shape_and_index():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.shape == (2, 3)
    assert m[1, 2] == 6


def test_ragged_rows():
    try:
        Matrix([[1, 2], [3]])
    except ValueError:
        return
    raise AssertionError("Matrix([[1, 2], [3]]) should raise ValueError")


def test_identity_and_zeros():
    assert Matrix.identity(2) == Matrix([[1, 0], [0, 1]])
    assert Matrix.zeros(1, 3) == Matrix([[0, 0, 0]])


def test_transpose():
    assert Matrix([[1, 2, 3], [4, 5, 6]]).transpose() == Matrix([[1, 4], [2, 5], [3, 6]])


def test_add_sub():
    a = Matrix([[1, 2], [3, 4]])
    b = Matrix([[10, 20], [30, 40]])
    assert a + b == Matrix([[11, 22], [33, 44]])
    assert b - a == Matrix([[9, 18], [27, 36]])


def test_add_shape_mismatch():
    try:
        Matrix([[1, 2]]) + Matrix([[1], [2]])
    except ValueError:
        return
    raise AssertionError("adding matrices of different shapes should raise ValueError")


def test_scale():
    assert Matrix([[1, -2]]).scale(3) == Matrix([[3, -6]])


def test_matmul():
    a = Matrix([[1, 2, 3], [4, 5, 6]])
    b = Matrix([[7, 8], [9, 10], [11, 12]])
    assert a @ b == Matrix([[58, 64], [139, 154]])


def test_matmul_mismatch():
    try:
        Matrix([[1, 2]]) @ Matrix([[1, 2]])
    except ValueError:
        return
    raise AssertionError("multiplying (1, 2) by (1, 2) should raise ValueError")


def test_trace():
    assert Matrix([[1, 2], [3, 4]]).trace() == 5


def test_determinant():
    assert Matrix([[1, 2], [3, 4]]).determinant() == -2.0
    assert abs(Matrix([[2, 0, 1], [1, 3, 2], [1, 1, 2]]).determinant() - 6) < 1e-9


def test_determinant_needs_pivoting():
    assert Matrix([[0, 1], [1, 0]]).determinant() == -1.0


def test_determinant_singular():
    assert Matrix([[1, 2], [2, 4]]).determinant() == 0.0


def test_power():
    fib = Matrix([[1, 1], [1, 0]])
    assert fib.power(10) == Matrix([[89, 55], [55, 34]])
    assert fib.power(0) == Matrix.identity(2)
    assert fib.power(1) == fib


def test_power_negative():
    try:
        Matrix([[1]]).power(-1)
    except ValueError:
        return
    raise AssertionError("power(-1) should raise ValueError")
