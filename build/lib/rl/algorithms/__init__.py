"""Credit assignment, on the controller's side: the `[algorithm]` section, one class per algorithm (its advantages,
token streams and drop rule) behind a registry, the shared advantage math, and how scored groups become training
samples (the loss itself runs in the trainer: `rl.training`).

Kept empty of imports: importing a subpackage must not import its siblings."""
