"""`clawloop up --ray auto|local`: the loops past one machine, as Ray actors.

    ray_runtime.py    connect (attach or start a loopback cluster), build the roles, close
    engine_actor.py   EngineActor: one hf engine replica per actor (max_restarts, placement group)
    router.py         RayEngine: the Engine protocol in the gateway process over the replicas (the actor
                      transport of engines/replicas.py's ReplicaSet, which vLLM's HTTP replicas share)
    trainer_group.py  DPTrainer / TrainerWorker / TrainerGroup / RayTrainerLoop: data-parallel training
    vllm_actor.py     VLLMHost / RayVLLMEngine: `--backend vllm` servers started on the actors' nodes
    env_actor.py      EnvPoolActor / start_env_pools: `clawloop buffer --ray --env-workers N` on {env: 1}
    weights.py        state dicts as object-store payloads (zero-copy numpy buffers)

Nothing here is imported unless `--ray` is given (or a test imports it): without it clawloop never
imports `ray`.
"""
