#!/bin/bash
set -euo pipefail
mkdir -p logs
python3 - <<'EOF'
import random
rng = random.Random(7)
ips = [f"10.0.{rng.randint(0, 3)}.{rng.randint(1, 254)}" for _ in range(25)] + ["192.168.1.10", "172.16.5.4"]
paths = ["/", "/login", "/api/items", "/api/items/42", "/static/app.js", "/static/logo.png", "/admin", "/health"]
codes = [200] * 30 + [304] * 6 + [404] * 5 + [500] * 2 + [502, 503, 301, 401, 403]
agents = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.4.0", "Googlebot/2.1 (+http://www.google.com/bot.html)"]
with open("logs/access.log", "w") as f:
    for i in range(800):
        ip = rng.choice(ips[:8]) if rng.random() < 0.5 else rng.choice(ips)
        code = rng.choice(codes)
        size = "-" if code in (304, 301) else str(rng.randint(120, 48000))
        t = f"12/Mar/2024:{8 + i // 100:02d}:{(i * 7) % 60:02d}:{(i * 13) % 60:02d} +0000"
        method = "POST" if rng.random() < 0.15 else "GET"
        f.write(f'{ip} - - [{t}] "{method} {rng.choice(paths)} HTTP/1.1" {code} {size} "-" "{rng.choice(agents)}"\n')
EOF
