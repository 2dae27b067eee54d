"""The controller's side of a run: the loop that drives it, admission of rows, the rollout buffer, the data stream, and the roles it starts.

Kept empty of imports: importing a subpackage must not import its siblings."""
