"""Tools a model may call: `Tool` and `ToolEnv`, the sandbox that runs them, the calculator.

Kept empty of imports."""
