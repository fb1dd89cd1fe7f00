#!/bin/bash
awk '{print $9}' logs/access.log | sort | uniq -c | sort -k1,1nr -k2,2n | awk '{print $2, $1}' > status_counts.txt
