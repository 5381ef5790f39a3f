"""Two FSDPPolicyShard actors on two nodes of a running cluster train on a pickled batch (tests/test_cluster.py).

    python tests/cluster_shards.py RAY_ADDRESS MODEL_DIR ITEMS.pkl OUT_DIR [FSDP_SIZE]

Placed as a run places them (placement groups of the colocated plan, one per node, on distinct
nodes); they rendezvous over gloo across the nodes, train once on their shares of the batch, and
rank 0 saves the adapter to OUT_DIR/adapter. Prints a JSON line: the metrics and each rank's node.
"""
import json
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(address: str, model_dir: str, items_path: str, out_dir: str, fsdp_size: str = "-1") -> None:
    import ray

    from actors.policy_shard import FSDPPolicyShard
    from controller.launch import slot_options
    from controller.runtime_env import runtime_env
    from placement.groups import create_groups, remove_groups
    from placement.plan import make_plan
    from rl.batch import split_for_ranks
    from settings import load_config
    from tests.fsdp_worker import ALGORITHM

    batch = pickle.loads(Path(items_path).read_bytes())  # written by the test itself
    cfg = load_config(None, ["trainer.placement.policy_num_nodes=2", "generator.inference_engine.num_engines=2",
                             "trainer.placement.device_resource=visrl_device", "trainer.placement.cpus_per_bundle=1"])
    plan = make_plan(cfg, use_gpu=False)
    ray.init(address=address, namespace="visrl-cluster-shards", runtime_env=runtime_env([], address))
    groups = create_groups(plan, timeout_s=120)
    try:
        shards = [ray.remote(FSDPPolicyShard).options(**slot_options(groups, pool, i, slot, "visrl-cluster-shards")).remote(
            model_dir, rank=slot.rank, world_size=2, device="cpu", lora={"rank": 4, "alpha": 8},
            optimizer={"lr": 1e-2}, seed=0, threads=1, fsdp_size=int(fsdp_size), record_collectives=True)
            for pool, i, slot in plan.slots("policy")]
        addr, port = ray.get(shards[0].address.remote())
        ray.get([s.setup.remote(addr, port) for s in shards])
        shares = split_for_ranks(batch["items"], 2)
        metrics = ray.get([s.train.remote(share, ALGORITHM, 1.0, 2, 1, batch["ref"]) for s, share in zip(shards, shares)])
        ray.get([s.save_adapter.remote(str(Path(out_dir) / "adapter")) for s in shards])
        nodes = ray.get([s.__ray_call__.remote(lambda actor: ray.get_runtime_context().get_node_id()) for s in shards])
        print(json.dumps({"metrics": metrics[0], "nodes": nodes}))
    finally:
        remove_groups(groups)
        ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:6])
