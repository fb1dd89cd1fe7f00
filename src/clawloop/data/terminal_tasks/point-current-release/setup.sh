#!/bin/bash
set -euo pipefail
mkdir -p releases
for v in v1.2.0 v1.9.3 v1.10.0 v1.10.0-rc2 v2.0.0-rc1 v0.9.12; do
  mkdir -p "releases/$v"; printf '%s\n' "$v" > "releases/$v/VERSION"
done
ln -s v1.2.0 releases/current
