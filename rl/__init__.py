"""rlmesh's framework: the run's config and CLI, and (one folder each) the loop, the algorithms, the trainer's
inside, weights, processes, services and metrics; the modules directly here are the ground floor they share
(section, registry, assets, batching, engine loop, checkpoints). The floors are asserted by tests/test_layout.py.

Kept empty of imports: importing a subpackage must not import its siblings."""
