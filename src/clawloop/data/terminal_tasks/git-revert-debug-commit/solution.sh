#!/bin/bash
cd service
bad=$(git log --format=%H --grep='debugging' | head -n 1)
git revert --no-edit "$bad"
