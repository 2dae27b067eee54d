"""The controller's side of a run: the loop that drives it, the roles it starts and stops, the run's state on disk,
admission of rows, the rollout buffer, the data stream, and `rlmesh bench`.

Kept empty of imports: importing a subpackage must not import its siblings."""
