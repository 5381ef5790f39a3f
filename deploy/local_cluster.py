"""A multi-node Ray cluster on one machine, started with Ray's own CLI: how to try the cluster
topology of the reference run (docs/cluster.md) on a laptop.

    python deploy/local_cluster.py up [--workers 2] [--cpus 2] [--devices 1]   # head + worker nodes
    python deploy/local_cluster.py add-worker [--cpus 2] [--devices 1]         # a (replacement) node joins
    python deploy/local_cluster.py kill-worker w1                              # a node fails: SIGKILL, all of it
    python deploy/local_cluster.py platform [--replace-after 10]               # replace lost workers, as a platform does
    python deploy/local_cluster.py status                                      # nodes as Ray sees them
    python deploy/local_cluster.py down                                        # every node this script started

Nodes start without the Hugging Face and AWS variables of the shell that starts them (as a real
cluster's nodes would not have them): a run passes them on itself (controller/runtime_env.py).
The head is started as the reference's head is: `ray start --head` with no CPUs and no GPUs for
actors (the driver, the object store, the dashboard with its job server, and the actors that ask
for nothing: EnvPool, Checkpointer). Each worker is `ray start --address=...` with its own raylet
and object store, in a process session of its own, so that `kill-worker` can kill the raylet and
every process of that node at once, with SIGKILL, as a power cut would. Worker nodes stand in for
GPU nodes: each advertises `--devices` slots of the custom resource `visrl_device`, which a CPU run
asks for with `trainer.placement.device_resource=visrl_device` (on a GPU machine use --gpus and
leave the resource off). The cluster's addresses are written to <dir>/cluster.json:

    RAY_ADDRESS=$(python deploy/local_cluster.py address) python driver.py ray.address=auto ...
    ray job submit --address $(python deploy/local_cluster.py dashboard) --working-dir . -- python driver.py ...

The cluster keeps its session files in a temp dir of its own (each node in a folder of its own
inside it), so a plain `ray.init()` elsewhere on the machine starts its own instance instead of
joining this one (Ray joins the last `ray start` cluster it finds under /tmp/ray). `down` keeps the
nodes' Ray logs in <dir>/ray-logs-<time>/<node>/. Only this script's nodes are stopped by `down`
(never `ray stop`, which would stop every Ray instance on the machine). Dashboard and job server bind to 127.0.0.1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# run as a script from a checkout (python deploy/local_cluster.py), the project's packages sit beside it
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from controller.runtime_env import FORWARDED_ENV  # noqa: E402
from net import free_port  # noqa: E402
from storage.atomic import write_atomic  # noqa: E402

DEFAULT_DIR = Path("runs") / "cluster"  # under the folder it is run from
DEVICE_RESOURCE = "visrl_device"
# The head's GCS declares a silent node dead after 5 missed checks a second apart (~5 s), not Ray's
# default 5 x 3 s (~15 s): node-loss runs on one machine spend less time waiting. A check may take 2 s
# to answer, so that a live node on a loaded 2-core machine is not taken for a lost one.
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                      "RAY_health_check_failure_threshold": "5"}


def ray_cli() -> str:
    """The `ray` next to this Python (the venv's), else the one on PATH."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


class LocalCluster:
    def __init__(self, folder: Path | str = DEFAULT_DIR):
        self.dir = Path(folder).resolve()
        self.state_file = self.dir / "cluster.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    # ---- state ------------------------------------------------------------------------------
    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_file, json.dumps(self.state, indent=2))

    @property
    def address(self) -> str:
        return self.state["address"]

    @property
    def dashboard(self) -> str:
        return self.state["dashboard"]

    def env(self) -> dict:
        """The environment for a program that should join this cluster (RAY_ADDRESS, local auth off)."""
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "disabled"}

    # ---- nodes ------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str], env: dict | None = None) -> dict:
        """`ray start ... --block` in a session of its own; returns the node's record once it has joined."""
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / f"{name}.log", "ab")
        # `python` on the nodes (a job's entrypoint, say) is this environment's, as an image's would be;
        # your shell's credentials and caches are not: a run gets them only by passing them on
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**{k: v for k, v in os.environ.items() if k not in FORWARDED_ENV}, "PATH": path,
               "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        proc = subprocess.Popen([ray_cli(), "start", "--block", "--disable-usage-stats",
                                 "--temp-dir", self.node_temp_dir(name), "--dashboard-agent-listen-port", str(free_port()),
                                 "--min-worker-port", "0", "--max-worker-port", "0", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return {"name": name, "pid": proc.pid, "started": time.time()}

    def node_temp_dir(self, name: str) -> str:
        """Each node's session files in a folder of its own, as on machines of their own: a node that
        shares them unpacks a job's working directory over the copy other nodes' workers run in (Ray
        unpacks with overwrite=True), and those workers lose their working directory mid-run."""
        return self.state["temp_dir"] if name == "head" else f"{self.state['temp_dir']}/{name}"

    def up(self, workers: int = 2, cpus: float = 2, devices: int = 1, gpus: int = 0,
           object_store_mb: int = 512, timeout_s: float = 120) -> None:
        if self.state.get("head") and _alive(self.state["head"]["pid"]):
            raise SystemExit(f"a cluster from {self.dir} is already up ({self.address}); `down` it first")
        port, dash = free_port(), free_port()
        # short: Ray's socket paths under it must stay below the OS's 107 characters
        temp_dir = f"/tmp/visrl-ray-{port}"
        self.state = {"address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}", "workers": [],
                      "object_store_bytes": object_store_mb * 2**20, "temp_dir": temp_dir}
        self.state["head"] = self._start("head", [
            "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "0", "--num-gpus", "0",
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--ray-client-server-port", str(free_port()), "--object-store-memory", str(self.state["object_store_bytes"])],
            env=FAST_HEALTH_CHECKS)
        self._save()
        self.wait_for(1, timeout_s)
        for _ in range(workers):
            self.add_worker(cpus, devices, gpus, timeout_s)

    def add_worker(self, cpus: float = 2, devices: int = 1, gpus: int = 0, timeout_s: float = 120) -> dict:
        """A worker node joins (at start, or as the replacement of a lost one); returns its record."""
        alive = self.alive_nodes()
        name = f"w{len(self.state['workers']) + 1}"
        resources = {DEVICE_RESOURCE: devices} if devices else {}
        record = self._start(name, [
            "--address", self.address, "--node-ip-address", "127.0.0.1", "--num-cpus", str(int(cpus)),
            "--num-gpus", str(gpus), "--resources", json.dumps(resources),
            "--object-store-memory", str(self.state["object_store_bytes"])])
        self.state["workers"].append(record)
        self._save()
        self.wait_for(len(alive) + 1, timeout_s)
        new = [n for n in self.alive_nodes() if n not in alive]
        record["node_id"] = new[0] if len(new) == 1 else None
        record["joined"] = time.time()
        self._save()
        return record

    def kill_worker(self, name: str) -> dict:
        """SIGKILL every process of the worker node `name` (its raylet, object store, agents, actors)."""
        record = next((w for w in self.state["workers"] if w["name"] == name), None)
        if record is None:
            raise SystemExit(f"no worker '{name}' in {self.state_file}; workers: "
                             f"{', '.join(w['name'] for w in self.state['workers']) or 'none'}")
        _kill_session(record["pid"])
        record["killed"] = time.time()
        self._save()
        return record

    def down(self) -> None:
        nodes = self.state.get("workers", []) + ([self.state["head"]] if self.state.get("head") else [])
        for record in nodes:
            _kill_session(record["pid"])
        if self.state.get("temp_dir"):  # keep Ray's logs of the nodes beside cluster.json, drop the rest
            kept = self.dir / f"ray-logs-{int(time.time())}"
            for record in nodes:
                logs = Path(self.node_temp_dir(record["name"])) / "session_latest" / "logs"
                if logs.is_dir():
                    kept.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(logs.resolve()), str(kept / record["name"]))
            shutil.rmtree(self.state["temp_dir"], ignore_errors=True)
        if self.state_file.exists():
            self.state_file.unlink()
        self.state = {}

    def platform(self, replace_after_s: float = 10.0, cpus: float = 2, devices: int = 1, gpus: int = 0,
                 poll_s: float = 1.0) -> None:
        """Replace lost workers, as a managed platform does: a worker whose node Ray reports dead is
        cleaned up and, `replace_after_s` later, a new one joins. Runs until stopped (SIGTERM, Ctrl-C)."""
        while True:
            try:
                dead = {n["node_id"] for n in self.nodes() if not n["alive"]}
            except (RuntimeError, subprocess.TimeoutExpired):
                dead = set()
            for record in list(self.state["workers"]):
                if record.get("replaced_by") or record.get("node_id") not in dead:
                    continue
                print(f"platform: worker {record['name']} (node {record['node_id'][:8]}) is lost; "
                      f"replacing it in {replace_after_s:g}s", flush=True)
                _kill_session(record["pid"])  # whatever of it still runs
                time.sleep(replace_after_s)
                new = self.add_worker(cpus, devices, gpus)
                record["replaced_by"] = new["name"]
                self._save()
                print(f"platform: worker {new['name']} joined as node {new['node_id'][:8]}", flush=True)
            time.sleep(poll_s)

    # ---- what Ray sees ---------------------------------------------------------------------
    def nodes(self) -> list[dict]:
        """Ray's node table (node id, alive, resources), read from the GCS without joining as a driver."""
        out = subprocess.run([sys.executable, "-c", _NODES_SCRIPT, self.address], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        if out.returncode != 0:
            raise RuntimeError(f"cannot read the node table of {self.address}: {out.stderr.strip()[-500:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def alive_nodes(self) -> list[str]:
        return [n["node_id"] for n in self.nodes() if n["alive"]]

    def head_node_id(self) -> str:
        return next(n["node_id"] for n in self.nodes() if n["alive"] and n["is_head"])

    def wait_for(self, n_alive: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if len(self.alive_nodes()) >= n_alive:
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # the GCS is still starting
            if time.monotonic() > deadline:
                raise SystemExit(f"the cluster did not reach {n_alive} live node(s) in {timeout_s:g}s; "
                                 f"see the logs in {self.dir}")
            time.sleep(0.5)


# Reads the GCS's node table through Ray's GCS client: no driver, no job, no dashboard needed.
_NODES_SCRIPT = """
import json, sys
from ray._raylet import GcsClient
client = GcsClient(address=sys.argv[1])
nodes = client.get_all_node_info(timeout=30)
print(json.dumps([{"node_id": n.node_id.hex() if hasattr(n.node_id, "hex") else str(n.node_id),
                   "alive": n.state == 0, "is_head": bool(n.is_head_node),
                   "resources": dict(n.resources_total)} for n in nodes.values()]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _kill_session(pid: int) -> None:
    """SIGKILL the process session `pid` leads: `ray start --block` and every process of its node."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    import psutil
    for p in psutil.process_iter(["pid"]):  # anything that left the group keeps the session id
        try:
            if os.getsid(p.info["pid"]) == pid:
                os.kill(p.info["pid"], signal.SIGKILL)
        except (OSError, psutil.Error):
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="where cluster.json and the node logs go")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("up", "add-worker"):
        p = sub.add_parser(name)
        if name == "up":
            p.add_argument("--workers", type=int, default=2)
        p.add_argument("--cpus", type=float, default=2, help="logical CPUs a worker offers to actors")
        p.add_argument("--devices", type=int, default=1, help=f"slots of the custom resource {DEVICE_RESOURCE}")
        p.add_argument("--gpus", type=int, default=0, help="real GPUs a worker offers (GPU machines)")
    sub.add_parser("kill-worker").add_argument("name")
    p = sub.add_parser("platform")
    p.add_argument("--replace-after", type=float, default=10.0, help="seconds from a node's loss to its replacement")
    p.add_argument("--cpus", type=float, default=2)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--gpus", type=int, default=0)
    for name in ("down", "status", "address", "dashboard"):
        sub.add_parser(name)
    args = ap.parse_args(argv)
    cluster = LocalCluster(args.dir)
    if args.command != "up" and not cluster.state:
        print(f"no cluster is up from {args.dir}", file=sys.stderr)
        return 0 if args.command == "down" else 1
    if args.command == "up":
        cluster.up(args.workers, args.cpus, args.devices, args.gpus)
        print(f"cluster up: head {cluster.address} (dashboard {cluster.dashboard}), "
              f"{len(cluster.state['workers'])} worker node(s)")
    elif args.command == "add-worker":
        record = cluster.add_worker(args.cpus, args.devices, args.gpus)
        print(f"worker {record['name']} joined as node {record['node_id']}")
    elif args.command == "kill-worker":
        cluster.kill_worker(args.name)
        print(f"worker {args.name}: every process killed (SIGKILL)")
    elif args.command == "platform":
        cluster.platform(args.replace_after, args.cpus, args.devices, args.gpus)
    elif args.command == "down":
        cluster.down()
        print("cluster down")
    elif args.command == "address":
        print(cluster.address)
    elif args.command == "dashboard":
        print(cluster.dashboard)
    else:
        for n in cluster.nodes():
            print(f"{n['node_id']}  {'alive' if n['alive'] else 'dead '}  {'head ' if n['is_head'] else 'worker'}  "
                  f"{json.dumps({k: v for k, v in n['resources'].items() if not k.startswith('node:')})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
