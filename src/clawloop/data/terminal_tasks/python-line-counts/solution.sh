#!/bin/bash
files=$(find src -name '*.py' -type f | LC_ALL=C sort)
total=0
for f in $files; do
  n=$(wc -l < "$f")
  echo "$n $f"
  total=$((total + n))
done > loc_report.txt
echo "$total total" >> loc_report.txt
