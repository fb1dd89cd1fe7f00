#!/bin/bash
chmod 755 bin/*.sh
chmod 700 secrets
chmod 600 secrets/*
chmod -R o-w shared
