from pathlib import Path

RENAMED = {"IMG 0001.JPG": "img_0001.jpg", "Beach Day  (2).JPEG": "beach_day_(2).jpg",
           "family dinner.jpeg": "family_dinner.jpg", "sunset.jpg": "sunset.jpg",
           "Mountain   View.Jpg": "mountain_view.jpg", "scan 3.png": "scan_3.png"}


def test_names_normalized():
    assert {p.name for p in Path("photos").iterdir()} == set(RENAMED.values())


def test_contents_follow_the_rename():
    for old, new in RENAMED.items():
        assert Path("photos", new).read_text() == old + "\n"
