from pathlib import Path


def users(name):
    return set(Path(name).read_text().split())


def got(name):
    return [l.strip() for l in Path(name).read_text().splitlines() if l.strip()]


def test_churned():
    assert got("churned.txt") == sorted(users("users_2023.txt") - users("users_2024.txt"))


def test_new_users():
    assert got("new_users.txt") == sorted(users("users_2024.txt") - users("users_2023.txt"))
