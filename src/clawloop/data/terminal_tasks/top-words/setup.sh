#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(3)
vocab = ("the of and to in is that it was for on are as with his they at be this from have or by one had "
         "not but what all were when we there can an your which their said if do will each about how up out "
         "them then she many some so these would other into has more her two like him see time could no make "
         "than first been its who now people my made over did down only way find use may water long little "
         "very after words called just where most know").split()
words = []
for _ in range(3000):
    w = vocab[min(int(rng.paretovariate(1.2)) - 1, len(vocab) - 1)] if rng.random() < 0.7 else rng.choice(vocab)
    words.append(w.upper() if rng.random() < 0.05 else w.capitalize() if rng.random() < 0.1 else w)
lines = []
for i in range(0, len(words), 12):
    chunk = words[i:i + 12]
    lines.append(" ".join(chunk) + rng.choice([".", ",", ";", " -- it's", " (1999)", "!"]))
open("book.txt", "w").write("\n".join(lines) + "\n")
EOF
