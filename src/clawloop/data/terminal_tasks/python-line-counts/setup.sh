#!/bin/bash
set -euo pipefail
mkdir -p src/shop/models src/shop/api tests src/scripts
python3 - <<'EOF'
import random
rng = random.Random(2)
for p in ["src/shop/__init__.py", "src/shop/models/cart.py", "src/shop/models/user.py", "src/shop/api/routes.py",
          "src/shop/api/auth.py", "src/scripts/seed.py", "tests/test_cart.py", "src/shop/README.md",
          "src/scripts/deploy.sh"]:
    n = rng.randint(0, 120) if not p.endswith("__init__.py") else 0
    open(p, "w").write("".join(f"x_{i} = {i}\n" for i in range(n)) + ("# no newline at end" if "auth" in p else ""))
EOF
