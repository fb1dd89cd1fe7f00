#!/bin/bash
find data -type f -size +102400c -printf '%s %p\n' | sort -rn > large_files.txt
