"""A run on disk: its directory (claimed and locked), its checkpoints (parts, manifest, atomic commit), the resume
that continues one, the size estimate of a checkpoint, and the export of a checkpoint's policy as a model folder.

Kept empty of imports: importing a subpackage must not import its siblings."""
