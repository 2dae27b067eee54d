"""Credit assignment, on the controller's side: the `[algorithm]` section, advantages, and how a scored group
becomes training samples (the loss itself runs in the trainer: `rl.training`).

Kept empty of imports: importing a subpackage must not import its siblings."""
