"""An OpenEnv environment server as a task: the task starts the server on loopback and drives it as a `MessageEnv`.

    [[tasks]]
    name = "openenv"
    args = { app = "my_envs.guess:app", observation_key = "prompt", action_key = "message", num_train = 200 }
    env = { max_turns = 2, max_new_tokens = 16, max_total_tokens = 512, max_prompt_tokens = 448 }

`app` is the import path of an OpenEnv server's ASGI app (what openenv-core's `create_app(env, Action, Observation)`
returns); the task runs it with uvicorn in a subprocess it owns (loopback, on a socket the task binds and the server
inherits, so no other process can take its port; started by the first rollout, stopped at exit, and killed with the
process that started it). Each rollout opens its own session on the
server's WebSocket (openenv-core's `GenericEnvClient`): `reset(seed=row["seed"])`'s observation is the user message,
each reply is sent as the action `{action_key: reply text}`, and the step's observation is the next user message
until the server says `done`. The step rewards are the turns' rewards; the rubric sums them (`env_reward`).

A server that answers with something that is not a JSON observation (not JSON, a reward that is not a finite
number, `done` not a boolean), reports an error, or does not answer within `message_timeout_s`, ends that rollout
as an ERROR naming the server and what it sent; the other rollouts go on.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.fanout import RolloutContext, RolloutFn, task_rollout
from rollouts.types import Message, Rollout
from rubrics.builtins import env_reward
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task


class OpenEnvError(RuntimeError):
    """The OpenEnv server failed or answered something that is not an observation."""


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM it when the process that started it dies (Linux)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: the kernel picks a free one) and listening, which the server inherits:
    the port is held from the bind on, so no other process can be handed it before the server serves (a port probed
    by bind and close returns to the pool, and another process may take it, or already answer on it)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((host, port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


class OpenEnvServer:
    """`uvicorn <app>` on `host`, started once and stopped at interpreter exit (or with the thread that started it)."""

    def __init__(self, app: str, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 120.0):
        self.app, self.host, self.port, self.startup_timeout_s = app, host, port, startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.log_path = ""
        self._ready = False
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def ensure_started(self) -> str:
        """The server's base URL, once its `/health` answers (the first caller starts it)."""
        self._spawn()
        if self._ready:
            return self.base_url
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise OpenEnvError(f"the OpenEnv server {self.app!r} exited at start: {self._log()}")
                try:
                    if (await client.get(f"{self.base_url}/health")).status_code == 200:
                        self._ready = True
                        return self.base_url
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise OpenEnvError(
            f"the OpenEnv server {self.app!r} did not answer /health within {self.startup_timeout_s} s: {self._log()}"
        )

    def _spawn(self) -> None:
        """Start the process (once). In the calling thread, which should be long-lived: the server is signalled to
        stop when the thread that started it ends (PR_SET_PDEATHSIG follows the thread)."""
        with self._lock:
            if self.process is not None:
                if self.process.poll() is not None:
                    raise OpenEnvError(
                        f"the OpenEnv server {self.app!r} exited with {self.process.returncode}: {self._log()}"
                    )
                return
            with (
                _listening_socket(self.host, self.port) as listener,
                tempfile.NamedTemporaryFile(prefix="rlmesh-openenv-", suffix=".log", delete=False) as log,
            ):
                self.port = listener.getsockname()[1]
                self.log_path = log.name
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
                command = [sys.executable, "-m", "uvicorn", self.app, "--fd", str(listener.fileno())]
                self.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    pass_fds=(listener.fileno(),),
                    preexec_fn=_die_with_parent,
                )
            atexit.register(self.stop)

    def _log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Terminate the server (kill it after 5 s)."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _observation_text(observation: dict[str, Any], key: str | None, server: str) -> str:
    if key is None:
        return json.dumps(observation, sort_keys=True)
    if not isinstance(observation.get(key), str):
        raise OpenEnvError(f"OpenEnv server {server}: observation has no text field {key!r}: {observation!r:.500}")
    return observation[key]


class OpenEnvMessageEnv(MessageEnv):
    """One session on the server: reset's observation as the user message, each reply a step."""

    def __init__(self, base_url: str, seed: int, options: OpenEnvOptions):
        from openenv.core.generic_client import GenericEnvClient

        self.base_url, self.seed, self.options = base_url, seed, options
        self.client = GenericEnvClient(
            base_url=base_url, connect_timeout_s=options.message_timeout_s, message_timeout_s=options.message_timeout_s
        )

    async def _call(self, what: str, call: Any) -> tuple[dict[str, Any], float | None, bool]:
        """The validated (observation, reward, done) of a reset or step, or an OpenEnvError saying what went wrong."""
        server = f"{self.base_url} ({what})"
        try:
            result = await asyncio.wait_for(call(), self.options.message_timeout_s)
        except TimeoutError as exc:
            raise OpenEnvError(
                f"OpenEnv server {server} did not answer within {self.options.message_timeout_s} s"
            ) from exc
        except json.JSONDecodeError as exc:
            raise OpenEnvError(f"OpenEnv server {server} sent a reply that is not JSON: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            raise OpenEnvError(f"OpenEnv server {server} sent a reply that is not a JSON object: {exc}") from exc
        except (RuntimeError, ConnectionError, OSError) as exc:
            raise OpenEnvError(f"OpenEnv server {server} failed: {exc}") from exc
        observation, reward, done = result.observation, result.reward, result.done
        if not isinstance(observation, dict):
            raise OpenEnvError(f"OpenEnv server {server} sent observation {observation!r:.200}, not an object")
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
        ):
            raise OpenEnvError(f"OpenEnv server {server} sent reward {reward!r:.200}, not a finite number")
        if not isinstance(done, bool):
            raise OpenEnvError(f"OpenEnv server {server} sent done={done!r:.200}, not a boolean")
        return observation, None if reward is None else float(reward), done

    async def reset(self) -> ResetOutput:
        observation, _, _ = await self._call("reset", lambda: self.client.reset(seed=self.seed))
        messages: list[Message] = (
            [{"role": "system", "content": self.options.system_prompt}] if self.options.system_prompt else []
        )
        messages.append(
            {"role": "user", "content": _observation_text(observation, self.options.observation_key, self.base_url)}
        )
        return ResetOutput(messages=messages)

    async def step(self, assistant_message: Message) -> StepOutput:
        action = {self.options.action_key: assistant_message.get("content") or ""}
        observation, reward, done = await self._call("step", lambda: self.client.step(action))
        if done:
            return StepOutput(reward=reward, done=True)
        text = _observation_text(observation, self.options.observation_key, self.base_url)
        return StepOutput(messages=[{"role": "user", "content": text}], reward=reward, done=False)

    async def close(self) -> None:
        await self.client.close()


@dataclass(frozen=True)
class OpenEnvOptions:
    """How messages map onto the server's observations and actions."""

    observation_key: str | None
    """The observation's text field that becomes the user message (None: the whole observation as JSON)."""
    action_key: str
    """The action's field that carries the reply text."""
    system_prompt: str | None
    message_timeout_s: float


class OpenEnvTask(Task):
    """Episodes of the OpenEnv server `app`, seeded: held-out seeds 0..num_validation-1, training seeds the next
    `num_train`."""

    def __init__(
        self,
        app: str,
        observation_key: str | None = None,
        action_key: str = "message",
        system_prompt: str | None = None,
        num_train: int = 1000,
        num_validation: int = 32,
        message_timeout_s: float = 20.0,
        startup_timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        """`host`/`port`: where the server listens (loopback, a free port, unless set)."""
        if ":" not in app:
            raise ValueError(f"app must be an import path 'package.module:app', got {app!r}")
        if num_train < 1 or num_validation < 0:
            raise ValueError(f"num_train must be >= 1 and num_validation >= 0, got {num_train} and {num_validation}")
        if message_timeout_s <= 0 or startup_timeout_s <= 0:
            raise ValueError(f"timeouts must be > 0, got {message_timeout_s} and {startup_timeout_s}")
        self.server = OpenEnvServer(app, host, port, startup_timeout_s)
        self.options = OpenEnvOptions(observation_key, action_key, system_prompt, message_timeout_s)
        self.num_train, self.num_validation = num_train, num_validation

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        seeds = (
            range(self.num_validation)
            if split == "validation"
            else range(self.num_validation, self.num_validation + self.num_train)
        )
        return [{"seed": seed} for seed in seeds]

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        if self.server.process is None:
            raise OpenEnvError("the OpenEnv server is not started: rollouts go through OpenEnvTask.rollout")
        return OpenEnvMessageEnv(self.server.base_url, example["seed"], self.options)

    def build_rubric(self) -> Rubric:
        return Rubric([RewardFn(env_reward, weight=1.0)], error_reward=0.0)

    def rollout_fn(self) -> RolloutFn:
        return self.rollout

    async def rollout(self, row: dict[str, Any], context: RolloutContext) -> Rollout:
        """Start the server (once, outside the environment's timeout), then the usual message-env rollout."""
        await self.server.ensure_started()
        return await task_rollout(row, context)
