#!/bin/bash
h=$(git -C webapp log --diff-filter=A --format=%H -- config/secrets.env)
printf '%s\n' "$h" > leak_commit.txt
git -C webapp show "$h:config/secrets.env" | sed -n 's/^API_KEY=//p' > leaked_key.txt
