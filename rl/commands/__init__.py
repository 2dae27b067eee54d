"""The `rlmesh` command line: the parser and each verb's glue (train, validate, eval, bench, report, export,
new-task) above the loop they start.

Kept empty of imports: importing a subpackage must not import its siblings."""
