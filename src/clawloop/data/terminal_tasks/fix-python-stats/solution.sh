#!/bin/bash
cat > stats.py <<'EOF'
import sys


def main(path):
    with open(path) as f:
        raw = [line.strip() for line in f if line.strip()]
    values = sorted(float(x) for x in raw)
    n = len(values)
    mean = sum(values) / n
    mid = n // 2
    median = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2
    biggest = max(raw, key=float)
    print(f"count={n} mean={mean:.2f} median={median:.2f} max={biggest}")


if __name__ == "__main__":
    main(sys.argv[1])
EOF
