"""Where processes run: cluster placement, the trainer mesh, CPU pinning and interrupts.

Kept empty of imports: importing a subpackage must not import its siblings."""
