"""Replicated roles (policy generators, frozen models, reward actors) behind routers, with health checks and respawn.

Import from the modules (`rl.services.service`, ...): the launcher must import nothing that starts threads
(Monarch) before it blocks SIGINT (rl/processes/interrupts.py). Their config is `rl.config.services`.
"""
