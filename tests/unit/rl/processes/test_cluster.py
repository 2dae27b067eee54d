"""`[cluster]` config, the shipped cluster configs, per-process bootstrap, and how a batch is split over trainer ranks."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from rl.config import ConfigError, load_config
from rl.metrics.reduce import StepStats, merge_all, step_metrics
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.processes.cluster import Placement, bootstrap_command
from rl.training.distributed import Ranks, rank_rows
from tests.support.paths import CONFIGS, E2E_CONFIGS
from tests.support.refused_job import RefusedJob


def test_every_actor_process_enters_monarchs_bootstrap_through_the_exit_without_collecting():
    command = bootstrap_command({}, "cpu", first_gpu=0, gpus_per_proc=1)({"hosts": 0, "procs": 0})
    assert command.args == ["-m", "rl.processes.bootstrap"] and command.inherit_env
    assert "CUDA_VISIBLE_DEVICES" not in command.env


def test_each_process_owns_its_gpus_counted_from_its_own_host():
    command = bootstrap_command({"HF_HOME": "/shared/hf"}, "cuda", first_gpu=1, gpus_per_proc=2)
    points = [{"hosts": host, "procs": proc} for host in range(2) for proc in range(3)]
    envs = [command(point).env for point in points]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1,2", "3,4", "5,6"] * 2
    assert all(env["HF_HOME"] == "/shared/hf" for env in envs)


@pytest.mark.parametrize("name", ["qwen3_8b_slurm_2x8", "qwen3_8b_kubernetes_2x8"])
def test_shipped_gpu_cluster_configs_fill_two_nodes_of_eight_gpus(name):
    config = load_config(CONFIGS / f"{name}.toml")
    assert config.cluster.hosts.allocated() == {"trainer": 1, "generator": 1}
    assert config.trainer.num_procs * config.trainer.num_hosts == 8 and config.trainer.device == "cuda"
    assert config.generator.num_replicas * config.generator.tensor_parallel_size == 8
    assert config.weight_sync.transport == "torchstore"


def built_job(config_name: str, with_trainer: bool = True) -> dict:
    """The monarch job a shipped config builds, described from a subprocess (building one switches monarch's transport to TCP)."""
    script = (
        "import json, sys; from rl.config import load_config; from rl.processes.cluster import Placement; "
        f"c = load_config({str(CONFIGS / config_name)!r}); "
        f"job = Placement(c.cluster, c.trainer, c.generator, c.models, {with_trainer}).job; "
        "print(json.dumps({'type': type(job).__name__, 'active': job.active, 'meshes': getattr(job, '_meshes', None), "
        "'gpus_per_node': getattr(job, '_gpus_per_node', None), 'partition': getattr(job, '_partition', None)}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=CONFIGS.parent
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.processes
def test_shipped_slurm_config_builds_its_job_without_submitting():
    job = built_job("qwen3_8b_slurm_2x8.toml")
    assert job == {
        "type": "RlmeshSlurmJob",
        "active": False,
        "meshes": {"trainer": 1, "generator": 1},
        "gpus_per_node": 8,
        "partition": "gpu",
    }


@pytest.mark.processes
def test_an_evaluation_of_a_slurm_config_asks_for_no_trainer_host():
    job = built_job("qwen3_8b_slurm_2x8.toml", with_trainer=False)
    assert job["meshes"] == {"generator": 1}  # `rlmesh eval` starts no trainer: its 8-GPU node is not requested


@pytest.mark.skipif(
    importlib.util.find_spec("kubernetes") is None,
    reason="Monarch's KubernetesJob needs the `kubernetes` package, which no extra of pyproject.toml installs "
    "(scripts/setup_env.sh does not): `pip install kubernetes` to run this test",
)
def test_shipped_kubernetes_config_builds_its_job_without_submitting():
    job = built_job("qwen3_8b_kubernetes_2x8.toml")
    assert job["type"] == "KubernetesJob" and not job["active"]


def test_shipped_process_config_puts_a_two_rank_trainer_and_the_generator_on_two_hosts():
    config = load_config(E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml")
    assert config.cluster.scheduler == "process" and config.cluster.hosts.allocated() == {"trainer": 1, "generator": 1}
    assert config.trainer.num_procs == 2 and config.trainer.num_hosts == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {
                "cluster.hosts": "{ trainer = 2 }",
                "cluster.scheduler": "'process'",
                "weight_sync.transport": "'torchstore'",
            },
            "trainer.num_hosts = 1 but the cluster gives the trainer 2 host",
        ),
        ({"cluster.hosts": "{ generator = 2 }"}, "cluster.scheduler = 'local' has one host"),
        (
            {"cluster.hosts": "{ generator = 1 }", "cluster.scheduler": "'process'"},
            "set weight_sync.transport = 'torchstore'",
        ),
        ({"cluster.scheduler": "'kubernetes'"}, "needs a \\[cluster.kubernetes\\] section"),
        (
            {
                "cluster.hosts": "{ generator = 2 }",
                "cluster.scheduler": "'slurm'",
                "weight_sync.transport": "'torchstore'",
            },
            "generator.num_replicas \\(1\\) must be a multiple of cluster.hosts.generator",
        ),
        ({"cluster.hosts": "{ learner = 1 }"}, "cluster.hosts.learner: Extra inputs are not permitted"),
    ],
)
def test_inconsistent_cluster_configs_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", overrides)


def test_rows_go_round_robin_to_ranks_and_the_short_rank_gets_an_all_padding_row():
    samples = [TrainSample([7] * n, [False] + [True] * (n - 1), [-1.0] * n, 1.0, 0) for n in (9, 8, 7, 6, 5)]
    batch = pack_samples(samples, seq_len=10, pad_token_id=3)  # one sample per row, longest first: rows 0..4
    shares = [rank_rows(split_micro_batches(batch, 2), Ranks(rank, 2), micro_batch_size=2) for rank in range(2)]
    rows = [torch.cat(share) for share in shares]
    assert [len(share) for share in shares] == [2, 2]  # 3 rows each (5 + 1 padding) -> micro-batches of 2 and 1
    assert rows[0]["sequence_ids"][:, 0].tolist() == [0, 2, 4] and rows[1]["sequence_ids"][:, 0].tolist() == [1, 3, -1]
    pad = rows[1][2]
    assert (pad["sequence_ids"] == -1).all() and (pad["input_ids"] == 3).all() and not pad["loss_mask"].any()
    assert all(float(pad[f"{name}_weights"].abs().sum()) == 0 for name in ("rl", "ce", "ref_kl"))


def test_statistics_of_two_ranks_merge_like_one_process():
    one, first, second = StepStats(), StepStats(), StepStats()
    one.add("ratio", torch.tensor([1.0, 2.0, 4.0]))
    one.add_total("loss", 0.75)
    first.add("ratio", torch.tensor([1.0]))
    first.add_total("loss", 0.5)
    second.add("ratio", torch.tensor([2.0, 4.0]))
    second.add_total("loss", 0.25)
    spread = ("ratio",)
    assert step_metrics(merge_all([first.states(), second.states()]), spread) == pytest.approx(
        step_metrics(one.states(), spread)
    )
    assert step_metrics(merge_all([first.states(), second.states()]), spread)["ratio_mean"] == pytest.approx(7 / 3)


class FakeHosts:
    """A host mesh of `count` hosts that records where one-process meshes were spawned."""

    def __init__(self, count: int, spawned: list, host: int | None = None):
        self.count, self.spawned, self.host = count, spawned, host

    @property
    def sizes(self) -> dict[str, int]:
        return {"hosts": self.count} if self.host is None else {}

    def slice(self, hosts: int) -> "FakeHosts":
        return FakeHosts(self.count, self.spawned, host=hosts)

    def spawn_procs(self, per_host: dict, bootstrap_command):
        gpus = bootstrap_command({"hosts": 0, "procs": 0}).env["CUDA_VISIBLE_DEVICES"]
        self.spawned.append((self.host, per_host["procs"], gpus))


def test_service_replicas_go_round_robin_over_their_hosts_each_on_its_own_gpus():
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "trainer.device": "cuda",
            "generator.device": "cuda",
            "generator.num_replicas": "4",
            "generator.tensor_parallel_size": "2",
        },
    )
    placement = Placement(config.cluster, config.trainer, config.generator, config.models)
    spawned: list = []
    placement.hosts = {"generator": FakeHosts(2, spawned)}
    spawn = placement.replica_procs("generator", gpus_per_proc=2)
    for index in range(4):
        spawn(index)
    assert spawned == [(0, 1, "0,1"), (1, 1, "0,1"), (0, 1, "2,3"), (1, 1, "2,3")]


def test_frozen_model_replicas_go_on_the_models_hosts_after_the_models_declared_before():
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "models.teacher.path": "tiny-qwen3",
            "models.teacher.device": "cuda",
            "models.teacher.replicas": "2",
            "models.judge.path": "tiny-qwen3",
            "models.judge.device": "cuda",
            "models.judge.replicas": "2",
        },
    )
    placement = Placement(config.cluster, config.trainer, config.generator, config.models)
    spawned: list = []
    placement.hosts = {"models": FakeHosts(2, spawned)}
    for name in ("teacher", "judge"):
        spawn = placement.frozen_procs(name)
        for index in range(2):
            spawn(index)
    assert spawned == [(0, 1, "0"), (1, 1, "0"), (0, 1, "1"), (1, 1, "1")]  # teacher: slots 0, 1; judge: 2, 3


def test_frozen_model_replicas_on_the_launchers_host_take_the_gpus_after_the_trainer_and_generators(monkeypatch):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "trainer.device": "cuda",
            "generator.device": "cuda",
            "generator.num_replicas": "2",
            "models.judge.path": "tiny-qwen3",
            "models.judge.device": "cuda",
            "models.judge.replicas": "2",
        },
    )
    spawned: list = []
    monkeypatch.setattr("rl.processes.cluster.this_host", lambda: FakeHosts(1, spawned, host=0))
    spawn = Placement(config.cluster, config.trainer, config.generator, config.models).frozen_procs("judge")
    for index in range(2):
        spawn(index)
    assert spawned == [(0, 1, "3"), (0, 1, "4")]  # trainer: GPU 0, generators: 1 and 2


class OneHost:
    """The launcher's host: records the GPUs each one-process mesh spawned on it sees."""

    sizes: dict[str, int] = {}

    def __init__(self):
        self.gpus: list[str] = []

    def spawn_procs(self, per_host: dict, bootstrap_command):
        self.gpus.append(bootstrap_command({"procs": 0}).env["CUDA_VISIBLE_DEVICES"])


def _local_placement(config, with_trainer: bool = True) -> tuple[Placement, OneHost]:
    placement = Placement(config.cluster, config.trainer, config.generator, config.models, with_trainer)
    host = OneHost()
    placement.host_mesh = lambda role: host
    return placement, host


def test_the_shipped_gpu_config_runs_trainer_and_generator_on_one_gpu():
    config = load_config(CONFIGS / "sum_digits_smollm2_gpu.toml")
    placement, host = _local_placement(config)
    placement.replica_procs("generator", gpus_per_proc=config.generator.tensor_parallel_size)(0)
    assert host.gpus == ["0"]  # the trainer's GPU (before: "1", a GPU a one-GPU machine does not have)
    assert placement.local_gpus_needed() == {"trainer": 1, "generator": 1}
    placement.check_local_gpus(present=1)


def test_roles_needing_more_gpus_than_present_are_refused_with_the_counts():
    config = load_config(
        CONFIGS / "sum_digits_smollm2_gpu.toml",
        {
            "generator.colocate_with_trainer": "false",
            "generator.num_replicas": "2",
            "trainer.gpu_memory_fraction": "0.9",
        },
    )
    placement, _ = _local_placement(config)
    assert placement.local_gpus_needed() == {"trainer": 1, "generator": 3}
    with pytest.raises(
        ValueError, match=r"need 3 GPU\(s\) \(trainer up to GPU 0, generator up to GPU 2\), but 1 are present"
    ):
        placement.check_local_gpus(present=1)
    placement.check_local_gpus(present=3)


def test_cpu_roles_need_no_gpu():
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml")
    placement, _ = _local_placement(config)
    assert placement.local_gpus_needed() == {}
    placement.check_local_gpus(present=0)


def test_colocated_memory_shares_must_fit_one_gpu(tmp_path):
    gpu_config = CONFIGS / "sum_digits_smollm2_gpu.toml"
    with pytest.raises(ConfigError, match=r"0.7\) \+ generator.gpu_memory_utilization \(0.35\) exceeds 0.92"):
        load_config(gpu_config, {"trainer.gpu_memory_fraction": "0.7"})
    unlimited = tmp_path / "unlimited.toml"
    unlimited.write_text(gpu_config.read_text().replace("gpu_memory_fraction = 0.5", ""))
    with pytest.raises(ConfigError, match="set trainer.gpu_memory_fraction too"):
        load_config(unlimited)


def test_an_evaluation_on_the_launchers_host_gives_the_generators_the_first_gpus():
    config = load_config(
        CONFIGS / "sum_digits_smollm2_gpu.toml",
        {"generator.colocate_with_trainer": "false", "generator.num_replicas": "2"},
    )
    placement, host = _local_placement(config, with_trainer=False)
    spawn = placement.replica_procs("generator", gpus_per_proc=config.generator.tensor_parallel_size)
    spawn(0), spawn(1)
    assert host.gpus == ["0", "1"]  # with a trainer: "1", "2" (its GPU first)
    assert placement.local_gpus_needed() == {"generator": 2}
    placement.check_local_gpus(present=2)


def test_a_refused_allocation_names_the_scheduler_and_its_reason_and_keeps_nothing():
    from rl.processes.cluster import HostsNotAllocated

    config = load_config(E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml")
    placement = Placement(config.cluster, config.trainer, config.generator, config.models)
    placement.job = job = RefusedJob()
    with pytest.raises(
        HostsNotAllocated, match="^process: Failed to submit SLURM job: .*Memory specification"
    ) as error:
        placement.allocate()
    assert isinstance(error.value.__cause__, RuntimeError)
    assert job.killed == 1 and placement.hosts == {}
