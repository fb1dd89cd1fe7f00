#!/bin/bash
python3 - <<'EOF'
import hashlib, os
groups = {}
for root, _, files in os.walk("docs"):
    for f in files:
        p = os.path.join(root, f)
        groups.setdefault(hashlib.sha256(open(p, "rb").read()).hexdigest(), []).append(p)
removed = []
for paths in groups.values():
    for p in sorted(paths)[1:]:
        os.remove(p)
        removed.append(p)
open("removed.txt", "w").write("".join(p + "\n" for p in sorted(removed)))
EOF
