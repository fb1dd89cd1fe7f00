#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(11)
regions = ["North", "South", "East", "West", "Central"]
products = [("widget", "4.99"), ("gadget", "12.50"), ("gizmo", "7.25"), ("doohickey", "0.99"), ("sprocket", "3.10")]
with open("sales.csv", "w") as f:
    f.write("date,region,product,units,unit_price\n")
    for i in range(400):
        name, price = rng.choice(products)
        f.write(f"2024-{1 + i % 12:02d}-{1 + i % 28:02d},{rng.choice(regions)},{name},{rng.randint(1, 40)},{price}\n")
EOF
