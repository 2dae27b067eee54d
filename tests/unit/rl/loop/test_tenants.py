"""What LoRA tenants refuse to share (`rl.loop.tenants.sharing_problems`), each by its key."""

from rl.config import load_config
from rl.loop.tenants import sharing_problems, tenant_name
from tests.support.paths import TINY

LORA = {"trainer.lora.enabled": "true"}


def tenant(name: str, **overrides: str):
    return load_config(TINY, {**LORA, "run.name": name, **overrides})


def test_lora_runs_on_one_base_with_their_own_seeds_tasks_and_optimizers_share():
    a = tenant("a", **{"run.seed": "0"})
    b = tenant(
        "b",
        **{
            "run.seed": "1",
            "trainer.seed": "1",
            "trainer.lr": "1e-2",
            "trainer.lora.rank": "16",
            "run.steps": "7",
            "algorithm.group_size": "2",
            "generator.sampling.temperature": "0.7",
        },
    )
    assert sharing_problems([a, b]) == []


def test_what_one_engine_or_one_trainer_cannot_be_is_refused_by_name():
    a = tenant("a")
    b = tenant(
        "b",
        **{
            "model.path": "smollm2-135m-instruct",
            "generator.dtype": "bfloat16",
            "generator.max_num_seqs": "8",
            "trainer.dtype": "bfloat16",
            "trainer.lora.enabled": "false",
            "loss.kl_coef": "0.1",
        },
    )
    keys = [problem.split(":")[0] for problem in sharing_problems([a, b])]
    assert keys == [
        "trainer.lora.enabled",
        "loss.kl_coef",
        "model.path",
        "generator.dtype",
        "generator.max_num_seqs",
        "trainer.dtype",
    ]


def test_tenants_need_distinct_names_and_the_shared_memory_transport():
    a = tenant("same")
    b = tenant("same", **{"weight_sync.transport": "torchstore"})
    problems = sharing_problems([a, b])
    assert problems[0].startswith("run.name: tenants need distinct names")
    assert any(problem.startswith("weight_sync.transport: tenant same") for problem in problems)
    assert any(problem.startswith("weight_sync: tenant same differs") for problem in problems)
    assert tenant_name(tenant("my-run.2")) == "my_run_2"


def test_rlmesh_train_with_two_configs_refuses_what_cannot_be_shared_before_starting_anything(capsys):
    from rl.commands import cli

    assert cli.main(["train", "--config", str(TINY), "--config", str(TINY)]) == 2
    refused = capsys.readouterr().err
    assert "these configs cannot run as tenants of one base" in refused
    assert "run.name: tenants need distinct names" in refused
    assert "trainer.lora.enabled: tenant tiny_qwen3_e2e is not a LoRA run" in refused


def test_a_run_trained_as_a_tenant_is_told_apart_by_its_adapters_name(tmp_path):
    import shutil

    import torch
    import torch.distributed.checkpoint as dcp

    from rl.commands.tenants import is_tenant_run
    from tests.support.runs import fake_run

    def adapters_named(name: str):
        def write(tmp):
            shutil.rmtree(tmp / "trainer")
            key = f"base_model.model.model.layers.0.self_attn.q_proj.lora_A.{name}.weight"
            dcp.save({"model": {key: torch.zeros(8, 64)}}, checkpoint_id=tmp / "trainer")

        return write

    for name in ("tenant", "solo", "full"):
        (tmp_path / name).mkdir()
    tenant = fake_run(tmp_path / "tenant", [1], damage_before_commit=adapters_named("tenant_a"))
    solo = fake_run(tmp_path / "solo", [1], damage_before_commit=adapters_named("default"))
    assert is_tenant_run(tenant) and not is_tenant_run(solo)
    assert not is_tenant_run(fake_run(tmp_path / "full", [1]))  # a full fine-tune has no adapters
    assert not is_tenant_run(tmp_path / "nothing")


def _parameters(endpoint) -> list[tuple[str, object]]:
    """An endpoint's parameters after `self` (name, default), without `tenant`."""
    import inspect

    parameters = list(inspect.signature(endpoint._method).parameters.values())[1:]
    return [(p.name, p.default) for p in parameters if p.name != "tenant"]


def test_the_tenants_trainer_and_generator_take_every_argument_a_runs_roles_pass():
    """`Roles` calls the trainer and the generators as `PolicyTrainer` and `Generator` take their arguments; a tenant's
    handle passes the same ones, plus its tenant, to the shared actors."""
    import inspect

    from actors.generator import Generator
    from actors.tenant_generator import TenantGenerator
    from actors.tenant_trainer import TenantTrainer
    from actors.trainer import PolicyTrainer
    from rl.loop.tenants import TENANT_ENDPOINTS, TRAINER_TENANT_ENDPOINTS

    pairs = [(TenantTrainer, PolicyTrainer, TRAINER_TENANT_ENDPOINTS), (TenantGenerator, Generator, TENANT_ENDPOINTS)]
    for tenants_class, solo_class, endpoints in pairs:
        for name in endpoints:
            tenant_endpoint = getattr(tenants_class, name)
            assert "tenant" in inspect.signature(tenant_endpoint._method).parameters, (tenants_class, name)
            assert _parameters(tenant_endpoint) == _parameters(getattr(solo_class, name)), (tenants_class, name)
