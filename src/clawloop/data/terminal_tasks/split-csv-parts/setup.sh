#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(31)
with open("orders.csv", "w") as f:
    f.write("order_id,customer,total,placed_at\n")
    for i in range(1, 1051):
        f.write(f"{100000 + i},cust{rng.randint(1, 300):03d},{rng.randint(100, 99999) / 100:.2f},2024-0{1 + i % 9}-{1 + i % 28:02d}\n")
EOF
