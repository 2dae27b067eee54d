"""What a task author's environment is: `MessageEnv` (messages in, messages out, no tokens), the chat
messages and tool-call errors it exchanges, and the renderer that turns messages into tokens and back.

Kept empty of imports."""
