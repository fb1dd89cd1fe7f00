"""`clawloop buffer`: the rollout buffer service composed, with its env pools as Ray actors under
`--ray --env-workers N`."""

from __future__ import annotations

import ipaddress

from clawloop.buffer.service import create_buffer_app, serving_app
from clawloop.config import Config, ConfigError


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_buffer(cfg: Config) -> None:
    """Serve the buffer on cfg.buffer.host:port until interrupted (blocks).

    With --ray and --env-workers N the track's environments run in N env-pool actors on the
    cluster's env nodes (`distributed.env_actor`), and generators reach them through
    `env_pool_url` (a SpreadPool); they are stopped, and Ray left, when the buffer exits."""
    import uvicorn

    if not _is_loopback(cfg.buffer.host) and not cfg.serve.insecure:
        raise ConfigError(f"buffer.host: binding {cfg.buffer.host} lets anyone who can reach it write training data "
                          "and start generators; bind 127.0.0.1, or pass --insecure if you really mean it")
    pools = None
    if cfg.ray.mode and cfg.ray.env_workers > 0:  # ray is imported only here
        if not cfg.env.track:
            raise ConfigError("env.track: --env-workers starts env pools for one track; name it with --env-type "
                              "(or ENV_TYPE): toolcall, terminal, swe or gui")
        if cfg.env.pool_url:
            raise ConfigError("env.pool_url: --env-pool-url and --env-workers both say where environments run; "
                              "pass one of them")
        import ray  # imported only under --ray

        from clawloop.distributed.env_actor import start_env_pools
        from clawloop.distributed.ray_runtime import connect

        info = connect(cfg)
        try:
            pools = start_env_pools(cfg)
        except BaseException:
            ray.shutdown()
            raise
        cfg.env.pool_url = ",".join(pools.urls)  # read by every /start_rollout's payload
        pools.on_change = lambda urls: setattr(cfg.env, "pool_url", ",".join(urls))
        print(f"clawloop: {len(pools.urls)} {cfg.env.track} env pool(s) on the ray {info['mode']} cluster at "
              f"{info['address']} ({{{cfg.ray.env_resource!r}: 1}} each): "
              + ", ".join(f"{h['url']} (node {h['node_ip']})" for h in pools.health()), flush=True)
    try:
        app = create_buffer_app(cfg)
        app.state.env_pools = pools
        if cfg.env.track:  # ENV_TYPE=terminal clawloop buffer: start that track's rollout at once
            started = app.state.buffer.start_rollout({"task_type": cfg.env.track},
                                                     f"http://{cfg.buffer.host}:{cfg.buffer.port}")
            print(f"clawloop: {cfg.env.track} rollout started (pid {started.get('pid')}, log {started.get('log')})",
                  flush=True)
        print(f"clawloop: rollout buffer on http://{cfg.buffer.host}:{cfg.buffer.port} "
              f"(store {app.state.buffer.store.path}; generators: {', '.join(sorted(app.state.buffer.generators))})",
              flush=True)
        uvicorn.run(serving_app(app), host=cfg.buffer.host, port=cfg.buffer.port, access_log=False,
                    proxy_headers=False, log_level="debug" if cfg.log_level == "debug" else "warning",
                    timeout_graceful_shutdown=30)
    finally:
        if pools is not None:
            import ray

            pools.close()
            ray.shutdown()
