#!/bin/bash
mkdir -p unpacked
tar -xzf release.tar.gz -C unpacked
grep -rh '^license_key' unpacked | sed 's/^license_key *= *//' > license.txt
