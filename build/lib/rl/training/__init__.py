"""Inside the trainer process: the train step over packed micro-batches, losses, rollout correction, logprobs and ranks (dtypes and autocast: `rl.precision`).

Kept empty of imports: importing a subpackage must not import its siblings."""
