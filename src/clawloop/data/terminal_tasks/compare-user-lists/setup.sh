#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(5)
names = [f"{a}{b}" for a in ("ana", "ben", "cho", "dev", "eli", "fay", "gus", "hal") for b in ("", "_k", "99", "x")]
y23 = rng.sample(names, 20)
y24 = rng.sample(names, 18)
for fn, ys in (("users_2023.txt", y23), ("users_2024.txt", y24)):
    rows = ys + rng.choices(ys, k=15)
    rng.shuffle(rows)
    open(fn, "w").write("\n".join(rows) + "\n")
EOF
