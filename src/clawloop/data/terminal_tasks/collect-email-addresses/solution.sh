#!/bin/bash
grep -rhoE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}' mail | tr 'A-Z' 'a-z' | sort -u > addresses.txt
