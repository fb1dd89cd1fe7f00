#!/bin/bash
{ echo "region,revenue"
  awk -F, 'NR > 1 {rev[$2] += $4 * $5} END {for (r in rev) printf "%s,%.2f\n", r, rev[r]}' sales.csv | sort
} > region_revenue.csv
