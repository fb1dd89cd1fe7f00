"""A small dense matrix of numbers (lists of rows)."""


class Matrix:
    def __init__(self, rows):
        if not rows or not rows[0]:
            raise ValueError("a matrix needs at least one row and one column")
        width = len(rows[0])
        for r in rows:
            if len(r) != width:
                raise ValueError("rows differ in length")
        self.rows = [list(r) for r in rows]

    @classmethod
    def identity(cls, n):
        return cls([[1 if i == j else 0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, n_rows, n_cols):
        return cls([[0] * n_cols for _ in range(n_rows)])

    @property
    def shape(self):
        return len(self.rows), len(self.rows[0])

    def __repr__(self):
        return f"Matrix({self.rows})"

    def __eq__(self, other):
        return isinstance(other, Matrix) and self.rows == other.rows

    def __getitem__(self, index):
        i, j = index
        return self.rows[i][j]

    def transpose(self):
        n, m = self.shape
        return Matrix([[self.rows[i][j] for i in range(n)] for j in range(m)])

    def __add__(self, other):
        if self.shape != other.shape:
            raise ValueError(f"shapes {self.shape} and {other.shape} differ")
        return Matrix([[a + b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)])

    def __sub__(self, other):
        if self.shape != other.shape:
            raise ValueError(f"shapes {self.shape} and {other.shape} differ")
        return Matrix([[a - b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)])

    def scale(self, k):
        return Matrix([[k * a for a in r] for r in self.rows])

    def __matmul__(self, other):
        n, m = self.shape
        m2, p = other.shape
        if m != m2:
            raise ValueError(f"cannot multiply {self.shape} by {other.shape}")
        out = []
        for i in range(n):
            row = []
            for j in range(p):
                row.append(sum(self.rows[i][k] * other.rows[k][j] for k in range(m)))
            out.append(row)
        return Matrix(out)

    def trace(self):
        n, m = self.shape
        if n != m:
            raise ValueError("trace needs a square matrix")
        return sum(self.rows[i][i] for i in range(n))

    def determinant(self):
        """By Gaussian elimination with partial pivoting (a float)."""
        n, m = self.shape
        if n != m:
            raise ValueError("determinant needs a square matrix")
        a = [[float(x) for x in r] for r in self.rows]
        det = 1.0
        for col in range(n):
            pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
            if a[pivot][col] == 0:
                return 0.0
            if pivot != col:
                a[col], a[pivot] = a[pivot], a[col]
                det = -det
            det *= a[col][col]
            for r in range(col + 1, n):
                factor = a[r][col] / a[col][col]
                for c in range(col, n):
                    a[r][c] -= factor * a[col][c]
        return det

    def power(self, k):
        """The matrix multiplied by itself `k` times (k >= 0), by repeated squaring."""
        if k < 0:
            raise ValueError("negative powers are not supported")
        n, m = self.shape
        if n != m:
            raise ValueError("power needs a square matrix")
        result = Matrix.identity(n)
        base = self
        while k > 0:
            if k % 2 == 1:
                result = result @ base
            base = base @ base
            k //= 2
        return result
