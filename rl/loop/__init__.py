"""The controller's side of a run: the loop that drives it, the roles it starts and stops, its resumable progress and
the checkpoints it commits, admission of rows, the rollout buffer, the data stream, the held-out validation, and a lost
trainer's recovery.

Kept empty of imports: importing a subpackage must not import its siblings."""
