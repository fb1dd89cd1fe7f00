#!/bin/bash
mkdir -p parts
header=$(head -n 1 orders.csv)
tail -n +2 orders.csv | split -l 250 -d -a 3 --numeric-suffixes=1 - parts/chunk_
for f in parts/chunk_*; do
  n=${f##*_}
  { printf '%s\n' "$header"; cat "$f"; } > "parts/part_$n.csv"
  rm "$f"
done
