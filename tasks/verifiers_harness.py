"""`GatewayChatHarness`: the verifiers harness `tasks.verifiers_env` gives every seat, a single-turn chat in-process.

verifiers' own chat harnesses launch a uv-managed program (it installs its dependencies from the network); this one
makes the model call from the rollout's process, through the interception `endpoint` (so verifiers' trace records it,
and the call reaches rlmesh's gateway through the run's client), which verifiers' `Harness.launch` contract allows.
verifiers loads harnesses by id from a module's `__all__`, hence a module of its own.
"""

from typing import Any

import openai
import verifiers.v1 as vf


class GatewayChatHarness(vf.Harness[vf.HarnessConfig]):
    """The task's (system) prompt in, one reply out."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        if mcp_urls:
            raise ValueError(f"GatewayChatHarness plays single-turn chats and has no tools; got MCP servers {mcp_urls}")
        system_prompt, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message.model_dump(mode="json", exclude_none=True) for message in prompt or []]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            try:
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
            except openai.APIError as exc:
                return vf.ProgramResult(exit_code=1, stdout="", stderr=f"model call failed: {exc}")
        return vf.ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")


__all__ = ["GatewayChatHarness"]
