#!/bin/bash
python3 - <<'EOF'
import json

def merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out

json.dump(merge(json.load(open("defaults.json")), json.load(open("production.json"))), open("config.json", "w"), indent=2)
EOF
