#!/bin/bash
set -euo pipefail
mkdir -p docs/2023 docs/2024/q1 docs/misc
printf 'budget v1\n' > docs/2023/budget.txt
printf 'budget v1\n' > docs/2024/budget.txt
printf 'budget v1\n' > docs/misc/budget-copy.txt
printf 'budget v2\n' > docs/2024/q1/budget.txt
printf 'minutes\n' > docs/misc/minutes.txt
printf 'minutes\n' > docs/2024/q1/Minutes.txt
printf 'plan\n' > docs/plan.txt
printf 'plan \n' > docs/misc/plan.txt
printf 'logo-bytes\0\1\2\n' > docs/misc/logo.bin
printf 'logo-bytes\0\1\2\n' > docs/logo.bin
