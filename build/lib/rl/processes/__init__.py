"""Where processes run and how they hold up: cluster placement, the trainer mesh, CPU pinning, interrupts, process names and a generator's native memory.

Kept empty of imports: importing a subpackage must not import its siblings."""
