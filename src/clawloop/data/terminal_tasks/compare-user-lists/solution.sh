#!/bin/bash
sort -u users_2023.txt > /tmp/a
sort -u users_2024.txt > /tmp/b
comm -23 /tmp/a /tmp/b > churned.txt
comm -13 /tmp/a /tmp/b > new_users.txt
