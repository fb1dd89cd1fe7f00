#!/bin/bash
{ echo "name,email,salary"
  awk -F, 'NR > 1 && $3 == "Engineering" {print $2 "," $6 "," $4}' employees.csv | sort -t, -k3,3nr
} > engineering.csv
