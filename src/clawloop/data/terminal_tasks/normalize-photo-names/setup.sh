#!/bin/bash
set -euo pipefail
mkdir -p photos
for f in "IMG 0001.JPG" "Beach Day  (2).JPEG" "family dinner.jpeg" "sunset.jpg" "Mountain   View.Jpg" "scan 3.png"; do
  printf '%s\n' "$f" > "photos/$f"
done
