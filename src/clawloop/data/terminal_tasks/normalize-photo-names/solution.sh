#!/bin/bash
cd photos
for f in *; do
  new=$(printf '%s' "$f" | tr 'A-Z' 'a-z' | tr -s ' ' '_' | sed 's/\.jpeg$/.jpg/')
  [ "$f" = "$new" ] || mv -- "$f" "$new"
done
