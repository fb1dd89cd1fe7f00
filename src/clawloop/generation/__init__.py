"""The library the generators are built on, kept out of the plugin files users copy.

`client.GatewayClient` is a generator's HTTP side (the gateway's chat calls with
retries, continuation of cut-off answers, the policy versions seen, writes to the
buffer); `answers` scores an arithmetic answer against its label and reads a
problems file. The math generator (`clawloop/generators/math_generator.py`), the
agent rollout every track's generator runs (`clawloop.envs.rollout`) and the
toolcall environment import them from here, so neither depends on the other and
a copied `*_generator.py` keeps working.

It imports nothing of clawloop's: generators, envs and the buffer all sit above it.
"""
