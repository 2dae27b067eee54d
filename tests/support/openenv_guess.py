"""A minimal OpenEnv environment for the OpenEnv-adapter tests, written with openenv-core's server API: guess a number
from 1 to 4 (drawn from the reset seed) in up to two tries; reward 1 for a right guess, 0 otherwise. `app` is the
server (`uvicorn tests.support.openenv_guess:app`)."""

import random
import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, 4)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt="I picked a number from 1 to 4. Guess it: answer with just the number.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        numbers = re.findall(r"\d+", action.message)
        right = bool(numbers) and int(numbers[-1]) == self.secret
        done = right or self._state.step_count >= 2
        hint = (
            "Right." if right else f"No, it is {'higher' if numbers and int(numbers[-1]) < self.secret else 'lower'}."
        )
        return GuessObservation(prompt=hint, reward=float(right), done=done)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=8)
