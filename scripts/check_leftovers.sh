#!/usr/bin/env bash
# Fails (exit 1) if a vLLM or Ray process is still running: run at the end of .ci/run, when every
# suite has stopped what it started, so a survivor is a leak of the run (a VLLM::EngineCore and its
# worker hold 2.6 GB on CPU; on a GPU, the memory a restarted server needs). Zombies (state Z) hold
# nothing and are not counted.
set -uo pipefail
left=$(ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/ && ($3 ~ /^VLLM::/ || $3 ~ /^ray::/ || $0 ~ /vllm_launch\.py/ || $0 ~ /vllm\.entrypoints/)')
if [ -n "$left" ]; then
  echo "check_leftovers: vLLM/Ray processes outlived the run:" >&2
  echo "$left" >&2
  exit 1
fi
echo "check_leftovers: no vLLM or Ray process left"
