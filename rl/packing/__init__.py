"""Training samples packed into `[B, L]` rows for the trainer. Side by side or as prefix trees (a shared prefix
forwarded once under a mask that gives every token exactly its own prefix), and which models that mask is exact for.

Kept empty of imports: importing a subpackage must not import its siblings."""
