"""The accounting room: sacct by device type and Prometheus metrics."""
