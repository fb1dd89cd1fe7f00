#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(21)
first = ["Ada", "Linus", "Grace", "Ken", "Barbara", "Dennis", "Margaret", "Guido", "Radia", "Bjarne", "Frances", "Alan"]
depts = ["Engineering", "Sales", "Engineering", "Support", "Finance", "Engineering Ops"]
rows = ["id,name,department,salary,start_date,email"]
salaries = rng.sample(range(52000, 190000, 250), 40)
for i in range(40):
    n = f"{rng.choice(first)} {chr(65 + i % 26)}{i}"
    rows.append(f"{100 + i},{n},{rng.choice(depts)},{salaries[i]},20{10 + i % 14}-0{1 + i % 9}-1{i % 10},"
                f"{n.split()[0].lower()}.{i}@corp.example")
open("employees.csv", "w").write("\n".join(rows) + "\n")
EOF
