"""Placement on a real 3-node Ray cluster with fake GPUs: actors land on the nodes the plan says;
an unsatisfiable plan fails fast with a message naming the missing resources."""
import pytest
import ray
from ray.cluster_utils import Cluster

from controller.launch import slot_options
from placement.groups import PlacementError, bundle_nodes, create_groups, remove_groups
from placement.plan import make_plan
from settings import load_config


@ray.remote
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()

    def gpu_ids(self):
        return ray.get_gpu_ids()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 2, "resources": {"node0": 1}})
    for n in (1, 2):
        c.add_node(num_cpus=4, num_gpus=2, resources={f"node{n}": 1})
    ray.init(address=c.address, namespace="visrl-test")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


# the reference's actors, its separate RefShards included
REFERENCE = ["trainer.placement.cpus_per_bundle=1", "trainer.device=cuda", "trainer.ckpt_path=s3://b/ckpts",
             "trainer.ref.from_policy_base=false"]


def test_colocated_plan_places_every_rank_on_its_node(cluster):
    cfg = load_config("configs/hyperpod_qwen3vl_8b.yaml", REFERENCE)
    plan = make_plan(cfg, use_gpu=True)
    groups = create_groups(plan, timeout_s=60)
    try:
        nodes = bundle_nodes(groups)
        probes = {}
        for role in ("policy", "ref", "engine"):
            for pool, i, slot in plan.slots(role):
                probes[slot.name] = (pool, i, Probe.options(**slot_options(groups, pool, i, slot, "visrl-test")).remote())
        where = {name: ray.get(p.node.remote()) for name, (_, _, p) in probes.items()}
        for name, (pool, i, _) in probes.items():
            assert where[name] == nodes[(pool.name, i)], name
        # the plan's node n holds ranks 2n and 2n+1 of each role, and one rank per GPU bundle
        for rank in range(6):
            node = where[f"FSDPPolicyShard-{rank}"]
            assert where[f"RefShard-{rank}"] == node and where[f"VLLMEngine-{rank}"] == node
            partner = rank ^ 1
            assert where[f"FSDPPolicyShard-{partner}"] == node
        assert len({where[f"FSDPPolicyShard-{r}"] for r in range(0, 6, 2)}) == 3
        # actors of one bundle share its GPU
        gpu = {name: ray.get(p.gpu_ids.remote()) for name, (_, _, p) in probes.items() if name.endswith("-0")}
        assert len({tuple(v) for v in gpu.values()}) == 1
        assert ray.get_actor("FSDPPolicyShard-3", namespace="visrl-test") is not None
        for _, _, p in probes.values():
            ray.kill(p)
    finally:
        remove_groups(groups)


def test_unsatisfiable_plan_fails_with_missing_resources(cluster):
    cfg = load_config("configs/hyperpod_qwen3vl_8b.yaml",
                      REFERENCE + ["trainer.placement.policy_num_gpus_per_node=4", "trainer.placement.ref_num_gpus_per_node=4",
                                   "generator.inference_engine.num_engines=12"])
    plan = make_plan(cfg, use_gpu=True)
    with pytest.raises(PlacementError) as e:
        create_groups(plan, timeout_s=3)
    msg = str(e.value)
    assert "GPU: plan needs 12, cluster has 6" in msg and "missing" in msg and "3 node(s)" in msg
    assert not ray.util.placement_group_table() or all(
        t["state"] == "REMOVED" for t in ray.util.placement_group_table().values())


def test_node_kills_name_their_phase_step_and_signal():
    import pytest

    from controller.chaos import parse_node_kills
    assert parse_node_kills(["train@5", "ckpt@7:sigterm"]) == ([("train", 5), ("ckpt", 7)], {("ckpt", 7): "sigterm"})
    for bad in ("train", "train@0", "nap@3", "train@3:sighup"):
        with pytest.raises(ValueError, match="PHASE@STEP"):
            parse_node_kills([bad])
