#!/bin/bash
set -euo pipefail
mkdir -p inbox
for f in "Report.PDF" "invoice-2024.pdf" "holiday.jpg" "IMG_0042.JPG" "logo.png" "notes.txt" \
         "todo list.txt" "Makefile" "README" "data.tar.gz" "archive.zip"; do
  printf '%s\n' "$f" > "inbox/$f"
done
