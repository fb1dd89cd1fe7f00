#!/bin/bash
cd handbook
gone=$(git log --diff-filter=D --format=%H -- docs/api.md | head -n 1)
git checkout "$gone~1" -- docs/api.md
git commit -qm "Restore docs/api.md"
