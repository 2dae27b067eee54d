"""The Monarch actors of a run, each in processes of its own: `Generator` (vLLM), `PolicyTrainer` (torch),
`RewardActor` (the tasks' rubrics). Each takes its own config section and explicit arguments.

Kept empty of imports: an actor module redirects its process's output when imported (rl/metrics/actor.py)."""
