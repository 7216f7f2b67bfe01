"""Node-side commands: HealthCheckProgram, TaskProlog and the node install (Python 3.9+)."""
