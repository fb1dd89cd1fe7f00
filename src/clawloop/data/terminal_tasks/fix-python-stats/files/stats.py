import sys


def main(path):
    with open(path) as f:
        values = [float(line) for line in f]
    values.sort()
    n = len(values)
    mean = sum(values) / n
    median = values[n // 2]
    biggest = max(values)
    print(f"count={n} mean={mean:.2f} median={median:.2f} max={biggest}")


if __name__ == "__main__":
    main(sys.argv[1])
