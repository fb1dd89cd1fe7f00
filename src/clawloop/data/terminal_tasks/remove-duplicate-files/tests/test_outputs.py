from pathlib import Path

REMOVED = ["docs/2024/budget.txt", "docs/misc/budget-copy.txt", "docs/misc/logo.bin", "docs/misc/minutes.txt"]
KEPT = ["docs/2023/budget.txt", "docs/2024/q1/Minutes.txt", "docs/2024/q1/budget.txt", "docs/logo.bin",
        "docs/misc/plan.txt", "docs/plan.txt"]


def test_duplicates_removed():
    assert not [p for p in REMOVED if Path(p).exists()]


def test_first_of_each_group_kept():
    assert sorted(str(p) for p in Path("docs").rglob("*") if p.is_file()) == KEPT


def test_removed_list():
    assert Path("removed.txt").read_text().split() == REMOVED
