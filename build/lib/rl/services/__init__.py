"""Replicated roles (policy generators, frozen models, reward actors) behind routers, with health checks and respawn.

Import from the modules (`rl.services.service`, ...): `rl.config` imports `rl.services.config`, and the
launcher must import nothing that starts threads (Monarch) before it blocks SIGINT (rl/processes/interrupts.py).
"""
