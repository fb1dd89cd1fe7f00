from pathlib import Path


def test_extracted_into_unpacked():
    assert Path("unpacked/bundle/conf/prod.ini").is_file()
    assert len(list(Path("unpacked/bundle/share/locale").glob("*.po"))) == 40


def test_license_key():
    assert Path("license.txt").read_text().strip() == "QX7-44K-P9Z-001"
