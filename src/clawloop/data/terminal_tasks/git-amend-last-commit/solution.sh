#!/bin/bash
cd reports
git add CHANGELOG.md
git commit -q --amend -m "Fix typo in report generator"
