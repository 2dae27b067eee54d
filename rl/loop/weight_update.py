"""A weight sync as the run does it: the trainer publishes a policy version, every generator reloads it (and, when
the run attests its syncs, proves it serves it), then admission moves on to that version."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from rl.loop.admission import Admission
from rl.loop.roles import Roles, full_refusal, refusal
from rl.loop.state import RunState


async def sync_policy(
    roles: Roles,
    state: RunState,
    admission: Admission,
    policy_version: int,
    rewind: bool = False,
    updating_held: bool = False,
) -> dict[str, float]:
    """The trainer publishes its weights as `policy_version`; every generator reloads them and, when the run
    attests its syncs, proves it serves them before it takes traffic (a replica that cannot is replaced like a dead
    one); a replica that cannot apply the version's delta (no base, or a check failed) keeps its version until the
    trainer has published the same version whole, then loads that; with `trainer.lora` every generator's probe logprobs must then be the trainer's (`AdapterNotServed`
    otherwise); admission moves on. Returns `weight_sync/attested` (1 when every replica proved it) and
    `time/attestation_s` (the trainer's fingerprints plus the slowest replica's measurement). `rewind`: an older
    version on purpose (a trainer recovery), which the attestation accepts. `updating_held`: the caller holds
    `generators.updating()` already (the recovery, for the whole trainer replacement)."""
    generators, timeout_s = roles.generators, roles.config.run.weight_sync_timeout_s
    # a replacement generator loads the version before or after, never half-way
    async with nullcontext() if updating_held else generators.updating():
        expected = await roles.push_weights(policy_version)
        expected = replace(expected, rewind=True) if expected is not None and rewind else expected
        replicas = len(generators.healthy)
        updates = await generators.update_weights.fanout(policy_version, expected, timeout_s=timeout_s, refuse=refusal)
        if any(update.needs_full for update in updates):  # a delta some replica has no base for, or rejected
            expected = await roles.push_weights(policy_version, full=True)
            expected = replace(expected, rewind=True) if expected is not None and rewind else expected
            updates = await generators.update_weights.fanout(
                policy_version, expected, timeout_s=timeout_s, refuse=full_refusal
            )
        if roles.config.trainer.lora.enabled:
            await roles.check_adapter_served(policy_version)  # end to end, through vLLM's LoRA kernels
        state.policy_version = policy_version
    await admission.set_policy_version(policy_version)
    if expected is None:
        return {}
    verdicts = [update.verdict for update in updates if update.verdict is not None]
    proven = sum(verdict.attested for verdict in verdicts)
    return {
        "weight_sync/attested": float(replicas > 0 and proven == replicas),
        "time/attestation_s": expected.seconds + max((verdict.seconds for verdict in verdicts), default=0.0),
    }
