"""Runtime layer: tasks, sessions, the warm pool, stall watching and the Supervisor."""
