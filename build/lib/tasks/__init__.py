"""Tasks: the `Task` contract, the shipped tasks, rows from files, building a task from its config, the
`new-task` scaffold and `run_task` for task tests.

Kept empty of imports."""
