#!/bin/bash
set -euo pipefail
mkdir -p data/raw/2023 data/raw/2024 data/cache data/reports
head -c 150000 /dev/zero > data/raw/2023/dump.bin
head -c 102400 /dev/zero > data/raw/2023/exactly_100k.bin
head -c 102401 /dev/zero > data/raw/2024/just_over.bin
head -c 5000 /dev/zero > data/raw/2024/small.bin
head -c 310000 /dev/zero > data/cache/blob.cache
head -c 120000 /dev/zero > "data/reports/q1 summary.pdf"
head -c 99000 /dev/zero > data/reports/q2.pdf
ln -s ../cache/blob.cache data/reports/latest.cache
