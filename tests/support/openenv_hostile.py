"""OpenEnv-protocol servers that misbehave on `step`, for the OpenEnv adapter's hostile-server tests: each app answers
`/health` and a valid `reset` on `/ws`, then `non_json_app` sends text that is not JSON, `nan_reward_app` a NaN
reward, `hung_app` nothing at all."""

import asyncio
import json

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

OBSERVATION = {
    "type": "observation",
    "data": {"observation": {"prompt": "Say anything."}, "reward": None, "done": False},
}


def hostile_app(step_reply: str | None) -> FastAPI:
    """A server whose `step` answer is `step_reply` verbatim (None: it never answers)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "healthy"}

    @app.websocket("/ws")
    async def session(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                message = json.loads(await websocket.receive_text())
                if message["type"] == "reset":
                    await websocket.send_text(json.dumps(OBSERVATION))
                elif message["type"] == "step":
                    if step_reply is None:
                        await asyncio.sleep(3600)
                    await websocket.send_text(step_reply)
                elif message["type"] == "close":
                    return
        except WebSocketDisconnect:
            return

    return app


non_json_app = hostile_app("<html>502 Bad Gateway</html>")
nan_reward_app = hostile_app(
    '{"type": "observation", "data": {"observation": {"prompt": "ok"}, "reward": NaN, "done": true}}'
)
hung_app = hostile_app(None)
