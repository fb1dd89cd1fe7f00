from pathlib import Path

WANT = {"pdf": {"Report.PDF", "invoice-2024.pdf"}, "jpg": {"holiday.jpg", "IMG_0042.JPG"}, "png": {"logo.png"},
        "txt": {"notes.txt", "todo list.txt"}, "other": {"Makefile", "README"}, "gz": {"data.tar.gz"},
        "zip": {"archive.zip"}}


def test_inbox_empty():
    assert Path("sorted").is_dir()
    assert list(Path("inbox").iterdir()) == []


def test_files_in_their_folders():
    got = {d.name: {f.name for f in d.iterdir()} for d in Path("sorted").iterdir() if d.is_dir()}
    assert got == WANT


def test_contents_kept():
    for ext, names in WANT.items():
        for n in names:
            assert Path("sorted", ext, n).read_text() == n + "\n"
