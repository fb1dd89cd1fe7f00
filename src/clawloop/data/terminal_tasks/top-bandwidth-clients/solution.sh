#!/bin/bash
awk '{b = ($10 == "-") ? 0 : $10; total[$1] += b} END {for (ip in total) print ip, total[ip]}' logs/access.log \
  | sort -k2,2nr | head -n 3 > top_clients.txt
