"""Placement groups and actor teardown, shared by every role's actors."""

from __future__ import annotations

from typing import Any


def reserve(count: int, num_cpus: float, num_gpus: float, strategy: str, timeout_s: float, what: str) -> Any:
    """A placement group of `count` bundles of {CPU: num_cpus, GPU: num_gpus}, ready; None when a
    bundle would be empty (the actors then take no resources). RuntimeError naming `what` when the
    cluster has no room for it within `timeout_s`."""
    import ray
    from ray.util.placement_group import placement_group

    bundle = {"CPU": float(num_cpus)} if num_cpus > 0 else {}
    if num_gpus > 0:
        bundle["GPU"] = float(num_gpus)
    if not bundle:
        return None
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"ray: no room for {count} {what}(s) of {bundle} ({strategy}) within {timeout_s:.0f} s; "
                           f"cluster resources: {ray.cluster_resources()}")
    return pg


def in_bundle(opts: dict[str, Any], pg: Any, index: int) -> dict[str, Any]:
    """Actor options placing it in bundle `index` of `pg` (unchanged when there is no group)."""
    if pg is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
    return opts


def release(actors: list[Any], pg: Any) -> None:
    """Kill `actors` for good and give the placement group back; whatever is already gone is fine."""
    import ray

    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:
            pass
    if pg is not None:
        try:
            ray.util.remove_placement_group(pg)
        except Exception:
            pass
