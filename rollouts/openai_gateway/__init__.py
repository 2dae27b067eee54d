"""An OpenAI-compatible HTTP endpoint over the policy's generators, recording every call of a rollout token-exact.

    agent ──HTTP /v1/chat/completions, /v1/completions──▶ OpenAIGateway ──▶ AgentSession (one per rollout)
                                                                             │ render (the task's renderer)
                                                                             ▼
                                                       generate (the rollout's generator replica) ──▶ RolloutTurn

An agent written against the OpenAI API trains as it is: each rollout gets its own base URL
(`http://HOST:PORT/rollouts/<key>/v1`, the key also its API key), so every call is attributed to
the rollout that made it and no rollout can reach another's session. Each call becomes one
`RolloutTurn` with the exact prompt token ids the renderer produced, the sampled token ids, their
logprobs and the policy version that sampled them.

Turns join into training samples by tokens (`rl.algorithms.streams.rollout_to_samples`). A chat call
whose history is the previous call's history plus the assistant message the gateway returned plus new
non-assistant messages is rendered by bridging (`env_types.renderer.next_turn_prompt`): its prompt extends
the previous prompt + sampled completion, so the conversation is one sample. Any other call (the agent
rewrote, dropped or re-ordered its history) is rendered afresh; when its prompt does not extend the
previous call's tokens it starts a new sample, counted in the rollout's metadata (`gateway_new_samples`)
and in the step's `rollouts/gateway_new_samples`. A completions call whose prompt text extends the
previous prompt + completion text reuses their tokens the same way.

Sampling is the run's (`generator.sampling`; validation: `generator.eval_sampling`), whatever the request's
`temperature`, `top_p` or `seed`: the samples must be the policy's. Calls are bounded by the task's
limits (`[tasks.env]`: prompt, new and total tokens, `max_turns` well-formed calls, refused ones too) and
`call_timeout_s`; a bad or unsupported request gets an OpenAI-style error (`{"error": {"message", "type", "param", "code"}}`) and
the rollout goes on. A rollout's calls run one at a time, in arrival order. Streaming (`stream=true`)
answers in the server-sent-event format once the completion is sampled (the generator returns whole
completions). The server listens on loopback unless given another host.
"""

from rollouts.openai_gateway.parsing import GatewayError
from rollouts.openai_gateway.server import OpenAIGateway
from rollouts.openai_gateway.session import AgentSession

__all__ = ["AgentSession", "GatewayError", "OpenAIGateway"]
