from types import SimpleNamespace

from rl.controller import gpu_placement


def test_cpu_processes_get_no_placement():
    assert gpu_placement("cpu", first_gpu=0, gpus_per_proc=1) is None


def test_each_generator_replica_owns_its_tensor_parallel_gpus():
    command = gpu_placement("cuda", first_gpu=1, gpus_per_proc=2)
    assert [command(SimpleNamespace(rank=rank)).env["CUDA_VISIBLE_DEVICES"] for rank in range(3)] == ["1,2", "3,4", "5,6"]
