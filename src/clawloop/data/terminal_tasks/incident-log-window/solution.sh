#!/bin/bash
awk '$1 == "2024-03-05" && $2 >= "14:00:00" && $2 <= "14:59:59" && ($3 == "ERROR" || $3 == "CRITICAL")' app.log > incident.log
