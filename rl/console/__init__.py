"""What rlmesh tells the user on the console besides the progress bar and the step lines (`rl.metrics.backends`):
`rl.console.lines.warn` for a warning, `rl.console.lines.say` for a status line.

Kept empty of imports: importing a subpackage must not import its siblings."""
