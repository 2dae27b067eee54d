"""Per-host estimates of `rlmesh validate` against values computed by hand from the models' architectures, and the
Slurm warning that names what each trainer rank loads.

tiny-qwen3 (its config.json: vocab 151669, hidden 64, 2 layers, 4 heads and 2 KV heads of 32, MLP 128, tied):
  a layer: q 64x128 + k 64x64 + v 64x64 + o 128x64 = 24576, q/k norms 2x32, MLP 3 x 64x128 = 24576, 2 norms of 64
  = 49344; 2 layers 98688 + embedding 151669x64 = 9706816 + final norm 64: P = 9805568, S = P + 9706816 (lm_head).
SmolLM2-135M (vocab 49152, hidden 576, 30 layers, 9 heads and 3 KV heads of 64, MLP 1536, tied):
  a layer: 2 x 576x576 + 2 x 576x192 + 3 x 576x1536 + 2 x 576 = 3540096; x30 = 106202880 + embedding 49152x576 =
  28311552 + 576: P = 134515008, S = P + 28311552.
A sharded load reads the tensors in the state dict's order (the embedding first, a layer's q, k, v, o, gate, up, down
projections then its two norms, the final norm last) and adds a fixed 12 MiB and 150 KiB per decoder layer of objects
(`rl.commands.footprint.LOAD_FIXED_BYTES`, measured).
"""

import torch

from rl.commands.cli import main
from rl.commands.footprint import footprint, footprint_lines, run_footprint, slurm_memory_warning
from rl.config import load_config
from rl.loop.resolve import resolve_config
from tests.support.paths import CONFIGS, E2E_CONFIGS, TINY

TINY_P, TINY_S = 9_805_568, 9_805_568 + 9_706_816
SMOLLM2_P, SMOLLM2_S = 134_515_008, 134_515_008 + 28_311_552
PROCESS_2HOSTS = E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml"
TINY_OVERHEAD = 12 * 2**20 + 2 * 150 * 2**10  # the load's objects: fixed, and per decoder layer
SMOLLM2_OVERHEAD = 12 * 2**20 + 30 * 150 * 2**10


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def test_the_models_are_counted_as_by_hand():
    tiny = run_footprint(resolve_config(load_config(TINY))).model
    assert (tiny.parameters, tiny.state_elements) == (TINY_P, TINY_S)
    smollm2 = run_footprint(resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml"))).model
    assert (smollm2.parameters, smollm2.state_elements) == (SMOLLM2_P, SMOLLM2_S)


def test_a_two_rank_trainer_and_a_generator_on_hosts_of_their_own():
    """tiny_qwen3_process_2hosts: 2 fp32 ranks on the trainer host, 1 fp32 generator on its own, torchstore."""
    config = resolve_config(load_config(PROCESS_2HOSTS))
    found = run_footprint(config)
    launcher, trainer_host, generator_host = found.hosts
    # its shard (fp32 files are read straight into it; every tensor's rows split evenly) and the load's objects
    assert found.rank.load_peak_bytes == TINY_P // 2 * 4 + TINY_OVERHEAD
    assert found.rank.training_bytes == 4 * (TINY_P // 2) * 4  # half of weights, grads, 2 moments (P is even)
    assert launcher.store_bytes == 0  # the store's volume is on the trainer host: the launcher holds no weights
    assert trainer_host.store_bytes == 3 * TINY_S * 4  # 2 versions kept, a 3rd while a push lands; lm_head put too
    assert launcher.roles == ["controller", "reward"] and trainer_host.roles == ["trainer", "torchstore"]
    # the generator's staging file: every key it pulled, the tied lm_head too
    assert (launcher.shm_bytes, trainer_host.shm_bytes, generator_host.shm_bytes) == (0, 0, TINY_S * 4)
    assert (trainer_host.trainer_ranks, generator_host.trainer_ranks, launcher.trainer_ranks) == (2, 0, 0)
    full = TINY_S * 4 + 2 * TINY_P * 4  # the state dict + AdamW's two moments
    assert found.checkpoint_bytes == found.checkpoint_disk_bytes == trainer_host.checkpoint_write_bytes == full
    assert full == 156_494_080


def test_everything_on_one_host_through_shared_memory():
    """The main job: SmolLM2-135M, fp32 trainer and sampler on the launcher's host, shared-memory weights."""
    config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml", {"checkpoint.every_steps": "5"}))
    found = run_footprint(config)
    [launcher] = found.hosts
    assert launcher.roles == ["controller", "torchstore", "trainer", "generator", "reward"]
    assert launcher.store_bytes == 0  # only handles go through the store
    assert launcher.shm_bytes == 2 * SMOLLM2_P * 4 == 1_076_120_064  # the trainer's two slots
    assert found.rank.training_bytes == 4 * SMOLLM2_P * 4
    assert found.checkpoint_bytes == 1_727_426_304  # (S + 2P) x 4: the 1.73 GB of rl.checkpoint.estimate
    assert found.checkpoint_disk_bytes == 2 * 1_727_426_304  # keep = 1, and the one committing


def test_a_kl_reference_is_loaded_by_shards_too():
    config = resolve_config(load_config(PROCESS_2HOSTS, {"loss.kl_coef": "0.01"}))
    found = run_footprint(config)
    shard = TINY_P // 2 * 4
    assert found.rank.load_peak_bytes == 2 * shard + TINY_OVERHEAD + 2 * 150 * 2**10  # a second model's layers
    assert found.rank.training_bytes == 5 * shard


def test_files_in_another_dtype_are_read_through_a_buffer_in_theirs():
    """SmolLM2-135M's files are bf16: with fp32 master weights each rank reads each tensor's slice through a bf16
    buffer. Its largest tensor, the tied embedding (49152 x 576), is read first, beside no other shard; the peak is at
    the last layer's down projection (1536 x 576: a bf16 buffer of half of it), with all shards read but the last
    three norms (576 each). fp32 files would go straight into the shard; one rank holds the whole fp32 model and the
    bf16 files it casts from."""
    config = resolve_config(
        load_config(CONFIGS / "sum_digits_smollm2_cpu.toml", {"trainer.num_procs": "2", "trainer.device": "cpu"})
    )
    found = run_footprint(config)
    assert found.model.file_dtype == torch.bfloat16
    down_buffer, last_norms = 1536 * 576 // 2 * 2, 3 * 576 // 2 * 4
    assert found.rank.load_peak_bytes == SMOLLM2_P // 2 * 4 + down_buffer - last_norms + SMOLLM2_OVERHEAD
    one = run_footprint(resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml")))
    assert one.rank.load_peak_bytes == SMOLLM2_P * 4 + SMOLLM2_P * 2 + SMOLLM2_OVERHEAD
    tiny = run_footprint(resolve_config(load_config(PROCESS_2HOSTS))).model
    assert tiny.file_dtype == torch.float32


def test_one_rank_loads_the_whole_model_and_a_reference_whole_after_it():
    config = resolve_config(load_config(TINY, {"loss.kl_coef": "0.01"}))
    found = run_footprint(config)
    assert found.rank.load_peak_bytes == 2 * TINY_P * 4 + TINY_OVERHEAD + 2 * 150 * 2**10


def test_slurm_without_memory_is_warned_with_what_each_rank_loads():
    config = resolve_config(
        load_config(
            TINY,
            {
                "cluster.scheduler": "slurm",
                "cluster.hosts.trainer": "2",
                "trainer.num_hosts": "2",
                "trainer.num_procs": "2",
                "weight_sync.transport": "torchstore",
            },
        )
    )
    found = footprint(config, run_footprint(config).model)
    warning = slurm_memory_warning(config, found)
    assert "no mem and cpus_per_task" in warning and "each of the 2 trainer rank(s) per host" in warning
    load = TINY_P // 4 * 4 + TINY_OVERHEAD  # 4 ranks: a quarter of the model, read straight from its fp32 files
    assert f"first loads {mib(load)} of the model's 9.8M parameters in float32" in warning
    assert f"keeps {mib(4 * (TINY_P // 4) * 4)} of weights" in warning  # 4 ranks in all
    lines = "\n".join(footprint_lines(found, config))
    assert "trainer host (x2) [trainer, torchstore]: 2 trainer rank(s)" in lines and "launcher [controller, " in lines
    assert f"torchstore volume up to {mib(3 * TINY_S * 4 // 2)} (its ranks' share of 3 versions in float32)" in lines
    config.cluster.slurm.mem, config.cluster.slurm.cpus_per_task = "64G", 8
    assert slurm_memory_warning(config, found) is None
    config.cluster.slurm.mem = None
    assert "(tiny-qwen3 is not on this machine to size it)" in slurm_memory_warning(config, None)
    assert "sets no mem:" in slurm_memory_warning(config, None)


def test_validate_prints_the_estimates(capsys):
    assert main(["validate", "--config", str(PROCESS_2HOSTS)]) == 0
    err = capsys.readouterr().err
    assert "rlmesh: estimate: launcher [controller, reward]: /dev/shm 0.0 MiB" in err
    assert "rlmesh: estimate: trainer host [trainer, torchstore]: 2 trainer rank(s)" in err
    assert f"torchstore volume up to {mib(3 * TINY_S * 4)} (3 versions in float32)" in err
    assert f"rlmesh: estimate: checkpoints: {mib(156_494_080)} each" in err


def test_delta_sync_counts_the_trainers_published_copy_and_each_replicas_resident_file():
    """A bf16 generator on the tiny run ("auto": deltas): one fp32 rank keeps weights, gradients, two moments (4 x P x 4)
    and the last published version in bf16 (P x 2); /dev/shm holds the trainer's two bf16 slots and the replica's
    resident bf16 file (3 x P x 2). Two ranks keep half the copy each; "never" keeps none."""
    config = resolve_config(load_config(TINY, {"generator.dtype": "bfloat16"}))
    found = run_footprint(config)
    assert found.rank.published_copy_bytes == TINY_P * 2 == 19_611_136
    assert found.rank.training_bytes == 4 * TINY_P * 4 + TINY_P * 2
    assert found.hosts[0].shm_bytes == 3 * TINY_P * 2
    assert "and of the last published version in bfloat16" in footprint_lines(found, config)[0]
    sharded = run_footprint(resolve_config(load_config(PROCESS_2HOSTS, {"generator.dtype": "bfloat16"})))
    assert sharded.rank.published_copy_bytes == TINY_P // 2 * 2
    assert sharded.hosts[2].shm_bytes == 2 * TINY_S * 2  # torchstore: the replica's staging and resident files
    never = run_footprint(
        resolve_config(load_config(TINY, {"generator.dtype": "bfloat16", "weight_sync.delta": "never"}))
    )
    assert never.rank.published_copy_bytes == 0 and never.rank.training_bytes == 4 * TINY_P * 4
    assert never.hosts[0].shm_bytes == 2 * TINY_P * 2
