#!/bin/bash
cd releases
v=$(ls -d v* | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V | tail -n 1)
ln -sfn "$v" current
printf '%s\n' "$v" > CURRENT_VERSION
