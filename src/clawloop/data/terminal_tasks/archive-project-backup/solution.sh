#!/bin/bash
mkdir -p backup
tar --exclude='*.log' --exclude='node_modules' -czf backup/project-backup.tar.gz project
